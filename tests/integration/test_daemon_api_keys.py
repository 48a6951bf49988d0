"""API keys on the real daemon, through each family's official SDK: OpenAI Bearer, Anthropic x-api-key,
Ollama Bearer; 401 for a missing or unknown key; management needs an admin key; a key removed from
the config file stops working after SIGHUP, without a restart."""

from __future__ import annotations

import signal
import time

import anthropic
import httpx
import ollama
import openai
import pytest

from tinymodel import write_tiny_gguf

from .daemon import Daemon

KEYS = '''api_keys = [
  { key = "sk-app", families = ["openai", "anthropic", "ollama"] },
  { key = "sk-ops", admin = true },
]
'''


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    tiny = write_tiny_gguf(root / "tiny.gguf")
    with Daemon(root, {"tiny": tiny}, n_seq_max=2, n_ctx=512, threads=1, extra=KEYS) as d:
        yield d


def test_every_family_with_its_own_sdk(daemon):
    ok = openai.OpenAI(base_url=daemon.url + "/v1", api_key="sk-app", max_retries=0).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert ok.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=daemon.url + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    msg = anthropic.Anthropic(base_url=daemon.url, api_key="sk-app", max_retries=0).messages.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert msg.stop_reason in ("max_tokens", "end_turn")
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=daemon.url, api_key="sk-wrong", max_retries=0).messages.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    tags = ollama.Client(host=daemon.url, headers={"Authorization": "Bearer sk-app"}).list()
    assert any(m.model.startswith("tiny") for m in tags.models)
    with pytest.raises(ollama.ResponseError) as exc:
        ollama.Client(host=daemon.url).list()
    assert exc.value.status_code == 401
    assert httpx.get(daemon.url + "/health").status_code == 200


def test_management_needs_admin_and_a_key_is_revoked_on_sighup(daemon):
    r = httpx.post(daemon.url + "/api/unload", json={"model": "tiny"}, headers={"authorization": "Bearer sk-app"})
    assert r.status_code == 403
    r = httpx.post(daemon.url + "/api/unload", json={"model": "tiny"}, headers={"authorization": "Bearer sk-ops"})
    assert r.status_code not in (401, 403), r.text
    text = daemon.config.read_text()
    daemon.config.write_text(text.replace('  { key = "sk-app", families = ["openai", "anthropic", "ollama"] },\n', ""))
    try:
        daemon.proc.send_signal(signal.SIGHUP)
        c = openai.OpenAI(base_url=daemon.url + "/v1", api_key="sk-app", max_retries=0)
        deadline = time.monotonic() + 10
        while True:
            try:
                c.models.list()
            except openai.AuthenticationError:
                break
            assert time.monotonic() < deadline, "the revoked key still works"
            time.sleep(0.1)
        assert openai.OpenAI(base_url=daemon.url + "/v1", api_key="sk-ops", max_retries=0).models.list().data
    finally:
        daemon.config.write_text(text)
        daemon.proc.send_signal(signal.SIGHUP)
