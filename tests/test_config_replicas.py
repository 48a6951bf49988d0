"""The replica keys: replicas, devices, endpoints, routing; device strings; errors that name the key."""

from __future__ import annotations

import pytest

from barrel_inference.config import load_settings
from barrel_inference.devices import Device, core_list, device_argv, device_env, parse_cores, parse_device


def settings_from(tmp_path, text: str):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    return load_settings(cfg, env={})


def test_replica_keys_parse_and_merge(tmp_path):
    s = settings_from(tmp_path, '[defaults]\nrouting = "least_loaded"\n'
                                '[models."a:1"]\nreplicas = 2\ndevices = ["0", "1"]\n'
                                '[models."b:1"]\nreplicas = 2\ndevices = ["0-7", "cpu:8-15"]\nrouting = "round_robin"\n'
                                '[models."c:1"]\nendpoints = ["tcp://h1:7601", "tcp://h2:7601"]\ninsecure = true\n')  # fmt: skip
    a, b, c, other = (s.model_settings(n) for n in ("a:1", "b:1", "c:1", "z:1"))
    assert (a.replicas, a.devices, a.routing) == (2, ["0", "1"], "least_loaded")  # [defaults] under the section
    assert (b.replicas, b.routing) == (2, "round_robin")
    assert c.endpoints == ["tcp://h1:7601", "tcp://h2:7601"]
    assert (other.replicas, other.devices, other.routing) == (1, None, "least_loaded")  # built-ins, [defaults]
    plain = settings_from(tmp_path, "port = 9000\n").model_settings("z:1")
    assert (plain.replicas, plain.devices, plain.endpoints, plain.routing) == (1, None, None, "affinity")


@pytest.mark.parametrize(
    "text, names",
    [
        ('[models."m:1"]\nreplicas = 2\ndevices = ["0", "1", "2"]\n', ['models."m:1".devices', "3 entries", "replicas = 2"]),
        ('[models."m:1"]\ndevices = ["0", "1"]\n', ['models."m:1".devices', "replicas = 1"]),
        ('[defaults]\nreplicas = 3\n[models."m:1"]\ndevices = ["0", "1"]\n', ['models."m:1".devices', "replicas = 3"]),
        ('[models."m:1"]\nreplicas = 0\n', ['models."m:1".replicas', "at least 1"]),
        ('[defaults]\nreplicas = -1\n', ["defaults.replicas"]),
        ('[models."m:1"]\nreplicas = 2\ndevices = ["0", "7-3"]\n', ['models."m:1".devices[1]', "7-3"]),
        ('[models."m:1"]\nreplicas = 2\ndevices = ["0", "gpu 1"]\n', ['models."m:1".devices[1]', "gpu 1"]),
        ('[models."m:1"]\nreplicas = 2\nendpoint = "tcp://h:1"\n', ['models."m:1".replicas', "endpoints"]),
        ('[models."m:1"]\nendpoints = ["tcp://a:1"]\nendpoint = "tcp://b:1"\n', ['models."m:1"', "endpoint", "endpoints"]),
        ('[models."m:1"]\nendpoints = ["tcp://a:1"]\ndevices = ["0"]\n', ['models."m:1".devices']),
        ('[models."m:1"]\nendpoints = ["tcp://a:1", "tcp://b:1"]\nreplicas = 3\n', ['models."m:1".replicas = 3', "2"]),
        ('[models."m:1"]\nendpoints = ["a"]\n', ['models."m:1".endpoints']),
        ('[models."m:1"]\nrouting = "random"\n', ["routing"]),
    ],
)  # fmt: skip
def test_replica_errors_name_the_key(tmp_path, text, names):
    with pytest.raises(ValueError) as info:
        settings_from(tmp_path, text)
    for name in names:
        assert name in str(info.value)


def test_devices_may_be_empty_with_replicas(tmp_path):
    s = settings_from(tmp_path, '[models."m:1"]\nreplicas = 3\n')
    assert (s.model_settings("m:1").replicas, s.model_settings("m:1").devices) == (3, None)


@pytest.mark.parametrize(
    "text, device",
    [
        ("0", Device("gpu", "0")),
        ("0,1", Device("gpu", "0,1")),
        ("gpu:2", Device("gpu", "2")),
        ("cuda:1", Device("gpu", "1")),
        ("GPU-8f3c2d1e-0000-1111", Device("gpu", "GPU-8f3c2d1e-0000-1111")),
        ("0-3", Device("cpu", "0-3", frozenset({0, 1, 2, 3}))),
        ("0-1,4-5", Device("cpu", "0-1,4-5", frozenset({0, 1, 4, 5}))),
        ("cpu:3", Device("cpu", "3", frozenset({3}))),
        ("cpu:5,0-1", Device("cpu", "0-1,5", frozenset({0, 1, 5}))),
    ],
)  # fmt: skip
def test_parse_device(text, device):
    assert parse_device(text) == device


@pytest.mark.parametrize("text", ["", "  ", "cpu:", "cpu:a", "cpu:3-1", "gpu:", "two words"])
def test_parse_device_refuses(text):
    with pytest.raises(ValueError):
        parse_device(text)


def test_device_environment_and_flags():
    gpu, cpu = parse_device("1"), parse_device("0-3")
    assert device_env(gpu) == {"CUDA_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"} and device_argv(gpu) == []
    assert device_env(cpu) == {} and device_argv(cpu) == ["--cpu-affinity", "0-3"]
    assert device_env(None) == {} and device_argv(None) == []
    assert parse_cores("2,0-1,7") == {0, 1, 2, 7} and core_list({0, 1, 2, 7}) == "0-2,7"


def test_worker_pins_itself_to_its_cores():
    import os

    from barrel_inference.worker.__main__ import parse_args, pin_cores

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity on this platform")
    assert parse_args(["--bind", "ipc:///x", "--model-name", "m", "--cpu-affinity", "0"]).cpu_affinity == "0"
    before = os.sched_getaffinity(0)
    try:
        assert pin_cores("0") == {0}
        assert os.sched_getaffinity(0) == {0}
    finally:
        os.sched_setaffinity(0, before)


def test_default_threads_are_the_cores_the_worker_may_use(monkeypatch):
    import os

    from barrel_inference.hostinfo import cpu_count

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no sched_getaffinity on this platform")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3, 5})
    assert cpu_count() == 3
