"""Chat completions in full on the real daemon (tiny GGUF): log-probabilities from the worker's
sampler distribution (after logit bias, bytes included, plain and streamed, chat and legacy
completions), suffix refused on a model without FIM tokens, system_fingerprint per model, and
GET /v1/models/{id}, through the official openai SDK where it speaks them."""

from __future__ import annotations

import math

import openai
import pytest

from tinymodel import write_tiny_gguf

from .daemon import Daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    root = tmp_path_factory.mktemp("chatfull")
    tiny = write_tiny_gguf(root / "tiny.gguf")
    qwen = write_tiny_gguf(root / "qwen.gguf", flavour="qwen2.5")
    with Daemon(root, {"tiny": tiny, "qwen": qwen}, n_seq_max=2, n_ctx=1024, threads=1) as d:
        yield d


def sdk(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_logprobs_are_the_samplers_distribution(daemon):
    c = sdk(daemon)
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=0, max_completion_tokens=6,
                                  logprobs=True, top_logprobs=20, seed=1, user="u1")  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    for item in content:
        tops = item.top_logprobs
        assert len(tops) == 20
        assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert item.token == tops[0].token and item.logprob == pytest.approx(tops[0].logprob)  # greedy: the most likely
        assert sum(math.exp(t.logprob) for t in tops) <= 1.0 + 1e-6 and item.logprob <= 0
        assert bytes(item.bytes).decode("utf-8", "replace") == item.token
    assert "".join(bytes(i.bytes).decode("latin-1") for i in content).encode("latin-1").decode("utf-8", "replace") == r.choices[0].message.content
    # a logit bias moves the distribution the log-probabilities come from
    from barrel_inference.worker.engine import LlamaEngine

    e = LlamaEngine(str(daemon.root / "tiny.gguf"), n_ctx=64, n_seq_max=1, threads=1)
    [token_id] = e.tokenize("Q", False, False)
    e.close()
    b = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=1,
                                  logprobs=True, top_logprobs=1, logit_bias={str(token_id): 100})  # fmt: skip
    first = b.choices[0].logprobs.content[0]
    assert first.token == "Q" and first.logprob > -0.01 and content[0].token != "Q"
    assert r.system_fingerprint and r.system_fingerprint.startswith("fp_")


def test_streamed_logprobs_one_per_token(daemon):
    c = sdk(daemon)
    n, text = 0, ""
    for chunk in c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=5,
                                           logprobs=True, top_logprobs=2, stream=True):  # fmt: skip
        for ch in chunk.choices:
            if ch.logprobs and ch.logprobs.content:
                n += len(ch.logprobs.content)
                assert all(len(i.top_logprobs) == 2 for i in ch.logprobs.content)
            text += ch.delta.content or ""
    assert n == 5


def test_legacy_completions_logprobs_echo_suffix(daemon):
    c = sdk(daemon)
    r = c.completions.create(model="tiny", prompt="abc", max_tokens=4, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) <= 3 for t in lp.top_logprobs) and lp.text_offset[0] == 0
    e = c.completions.create(model="tiny", prompt="abc", max_tokens=4, temperature=0, echo=True)
    assert e.choices[0].text == "abc" + r.choices[0].text
    with pytest.raises(openai.BadRequestError) as exc:
        c.completions.create(model="tiny", prompt="def f(", suffix="return 1", max_tokens=4)
    assert exc.value.body["param"] == "suffix"
    with pytest.raises(openai.BadRequestError) as exc:
        c.completions.create(model="tiny", prompt="x", best_of=2, max_tokens=4)
    assert exc.value.body["param"] == "best_of"


def test_fingerprint_per_model_and_model_lookup(daemon):
    c = sdk(daemon)
    fps = {m: c.chat.completions.create(model=m, messages=[{"role": "user", "content": "x"}], max_tokens=1).system_fingerprint
           for m in ("tiny", "qwen")}  # fmt: skip
    again = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "y"}], max_tokens=1, seed=5).system_fingerprint
    assert fps["tiny"] != fps["qwen"] and again == fps["tiny"]
    assert c.models.retrieve("tiny").id.startswith("tiny")
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("missing:1b")
