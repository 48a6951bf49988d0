import pytest

from barrel_inference.config import load_settings, parse_host


def test_defaults_without_file_or_env():
    s = load_settings(env={})
    assert (s.host, s.port) == ("127.0.0.1", 8080)
    assert s.model_settings("any").n_seq_max == 4


def test_file_then_env_then_overrides(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('port = 9000\nmodel_cache_dir = "/x"\n[aliases]\n"gpt-4o" = "gemma3:270m"\n'
                   '[defaults]\nn_ctx = 2048\n[models."big:7b"]\nn_seq_max = 8\nthreads = 6\n')  # fmt: skip
    s = load_settings(cfg, env={"BARREL_INFERENCE_HOST": "http://0.0.0.0:7000", "BARREL_INFERENCE_MODEL_CACHE_DIR": "/y"})
    assert (s.host, s.port, s.model_cache_dir) == ("0.0.0.0", 7000, "/y")
    assert s.aliases == {"gpt-4o": "gemma3:270m"}
    big, other = s.model_settings("big:7b"), s.model_settings("small")
    assert (big.n_seq_max, big.threads, big.n_ctx, big.n_batch) == (8, 6, 2048, 512)  # [defaults] and built-ins under it
    assert s.defaults.n_batch is None  # the file did not set it: a model's own value may apply
    assert (other.n_seq_max, other.n_ctx) == (4, 2048)
    assert load_settings(cfg, env={}, port=1234).port == 1234


def test_config_path_from_env(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("port = 9100\n")
    assert load_settings(env={"BARREL_INFERENCE_CONFIG": str(cfg)}).port == 9100


@pytest.mark.parametrize("value, expected", [("h", ("h", None)), ("h:1", ("h", 1)), ("http://h:2", ("h", 2)), ("[::1]:3", ("::1", 3))])
def test_parse_host(value, expected):
    assert parse_host(value) == expected


def test_unknown_key_is_a_clear_error(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(ValueError, match="prot"):
        load_settings(cfg, env={})


def test_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert load_settings(env={}).cache_dir() == tmp_path / "barrel_inference_server" / "models"


def test_reload_takes_aliases_and_keys_only(tmp_path):
    from barrel_inference.gateway.server import reload_config
    from barrel_inference.gateway.logging import make_logger

    settings = load_settings(env={}, port=9000, aliases={"a": "m1"})
    log = make_logger(settings)
    fresh = load_settings(env={}, port=9999, aliases={"a": "m2", "b": "m1"}, anthropic_api_keys=["k"])
    assert reload_config(settings, lambda: fresh, log) == ["aliases", "anthropic_api_keys"]
    assert settings.aliases == {"a": "m2", "b": "m1"} and settings.anthropic_api_keys == ["k"]
    assert settings.port == 9000  # not reloadable: the socket is bound

    def broken():
        raise ValueError("invalid configuration")

    assert reload_config(settings, broken, log) == [] and settings.aliases == {"a": "m2", "b": "m1"}


def test_example_config_loads_and_names_every_key():
    """deploy/config.example.toml is valid as written and documents every setting (commented or not)."""
    from pathlib import Path

    from barrel_inference.config import ModelSettings, Settings, load_settings

    example = Path(__file__).resolve().parents[1] / "deploy" / "config.example.toml"
    load_settings(example, env={})
    text = example.read_text()
    missing = [f for f in (*Settings.__struct_fields__, *ModelSettings.__struct_fields__) if f not in text]
    assert missing == []
