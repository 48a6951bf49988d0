"""bictl alias list / set / rm against the live test daemon: aliases change without a restart and persist."""

from __future__ import annotations

import json

import httpx
from click.testing import CliRunner

from barrel_inference.cli.main import main
from barrel_inference.gateway.aliases import aliases_file, apply_overrides

from .conftest import MODEL


def bictl(daemon, *args):
    return CliRunner().invoke(main, list(args), env={"BARREL_INFERENCE_HOST": daemon.host}, catch_exceptions=False)


def chat(daemon, model: str) -> httpx.Response:
    return httpx.post(daemon.url + "/v1/messages", json={"model": model, "max_tokens": 4,
                      "messages": [{"role": "user", "content": "hello alias"}]}, timeout=10)  # fmt: skip


def test_alias_set_list_rm_without_a_restart(daemon):
    assert chat(daemon, "claude-sonnet-4-5").status_code == 404
    r = bictl(daemon, "alias", "set", "claude-sonnet-4-5", "fake")
    assert r.exit_code == 0 and r.output.strip() == f"claude-sonnet-4-5 -> {MODEL}"
    answer = chat(daemon, "claude-sonnet-4-5")
    assert answer.status_code == 200 and answer.json()["model"] == "claude-sonnet-4-5"
    r = bictl(daemon, "--json", "alias", "list")
    assert json.loads(r.output) == {"claude-sonnet-4-5": MODEL}
    assert "claude-sonnet-4-5" in bictl(daemon, "alias", "list").output
    # kept across restarts: a fresh settings object gets it back from the cache dir
    assert json.loads(aliases_file(daemon.settings).read_text()) == {"claude-sonnet-4-5": MODEL}
    fresh = daemon.settings.__class__(model_cache_dir=daemon.settings.model_cache_dir)
    apply_overrides(fresh)
    assert fresh.aliases == {"claude-sonnet-4-5": MODEL}
    r = bictl(daemon, "alias", "rm", "claude-sonnet-4-5")
    assert r.exit_code == 0
    assert chat(daemon, "claude-sonnet-4-5").status_code == 404


def test_alias_to_an_unknown_model_or_rm_of_an_unknown_alias_fails(daemon):
    r = CliRunner().invoke(main, ["alias", "set", "x", "nosuch:1b"], env={"BARREL_INFERENCE_HOST": daemon.host})
    assert r.exit_code != 0 and "nosuch" in r.output
    r = CliRunner().invoke(main, ["alias", "rm", "never-set"], env={"BARREL_INFERENCE_HOST": daemon.host})
    assert r.exit_code != 0 and "never-set" in r.output
