"""The real daemon serving the real Gemma 3 270M — the embedded default model — for real text."""

import asyncio
import json
import re
import time

import httpx
import pytest

from .daemon import Daemon

pytestmark = pytest.mark.gemma
MODEL = "gemma3:270m"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    # no model registered: `serve` must register the packaged Gemma 3 270M itself
    d = Daemon(tmp_path_factory.mktemp("gemma"), {}, n_seq_max=4, n_ctx=1024, threads=2, embed_default=True)
    d.start(timeout=180)
    try:
        yield d
    finally:
        d.stop()


async def complete(c, prompt, **kw):
    r = await c.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


async def test_embedded_default_model_is_listed_and_answers_a_chat(daemon, gemma_gguf):
    from barrel_inference.worker.engine import LlamaEngine

    async with httpx.AsyncClient(base_url=daemon.url, timeout=120) as c:
        ids = [m["id"] for m in (await c.get("/v1/models")).json()["data"]]
        r = await c.post("/v1/chat/completions", json={
            "model": MODEL, "temperature": 0, "max_tokens": 16,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
        })  # fmt: skip
        real = await complete(c, "The days of the week are Monday, Tuesday,", max_tokens=4)
    assert MODEL in ids
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"].strip()
    # the GGUF has no template: the built-in Gemma turn format was applied
    rendered = "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
    engine = LlamaEngine(str(gemma_gguf), n_ctx=64, n_seq_max=1, threads=1)
    try:
        assert body["usage"]["prompt_tokens"] == len(engine.tokenize(rendered, add_special=False))
    finally:
        engine.close()
    assert "wednesday" in real["text"].lower()  # real text from the real model


async def test_max_tokens_gives_length(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=120) as c:
        choice = await complete(c, "Once upon a time", max_tokens=5)
    assert choice["finish_reason"] == "length"


async def test_stop_sequence_split_across_tokens(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=120) as c:
        # twice: the second run reuses the first one's KV for all but the prompt's last token, as the
        # stopped run below will, so both split the work the same way (llama.cpp's numerics depend on how a prompt is split into batches)
        await complete(c, "The days of the week are Monday, Tuesday,", max_tokens=24)
        free = (await complete(c, "The days of the week are Monday, Tuesday,", max_tokens=24))["text"]
        words = free.split()
        assert len(words) >= 4, free
        stop = " ".join(words[1:3])  # two words: necessarily more than one token
        cut = free.index(stop)
        stopped = await complete(c, "The days of the week are Monday, Tuesday,", max_tokens=24, stop=[stop])
    assert stopped["finish_reason"] == "stop"
    assert stopped["text"] == free[:cut]
    assert stop not in stopped["text"]


async def test_concurrent_streams_never_mix(daemon):
    words = ["apple", "river", "cloud", "stone"]

    async def repeat(c, word):
        chunks, times = [], []
        body = {"model": MODEL, "prompt": " ".join([word] * 12), "max_tokens": 12, "temperature": 0, "stream": True}
        async with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    text = json.loads(line[6:])["choices"][0]["text"]
                    if text:
                        chunks.append(text)
                        times.append(time.monotonic())
        return "".join(chunks), times

    async with httpx.AsyncClient(base_url=daemon.url, timeout=120) as c:
        outs = await asyncio.gather(*(repeat(c, w) for w in words))
    for word, (out, _) in zip(words, outs):
        assert word in out.lower(), (word, out)
        assert not any(other in out.lower() for other in words if other != word), (word, out)
    # the streams overlapped: every one had sent text before any of them sent its last
    firsts = [times[0] for _, times in outs]
    lasts = [times[-1] for _, times in outs]
    assert max(firsts) < min(lasts), (firsts, lasts)


NO_EOS = {"1": -100, "106": -100}  # <eos>, <end_of_turn>: every request runs to max_tokens
LISTS = {  # prompt -> the next items of its list: the first comes from the prefill's row, the others from decode rows
    "The days of the week are Monday, Tuesday,": ["wednesday", "thursday", "friday"],
    "The months of the year are January, February,": ["march", "april", "may"],
    "Counting in words: one, two, three, four,": ["five", "six", "seven"],
    "The colours of the rainbow are red, orange,": ["yellow", "green", "blue"],
}


async def test_distinct_greedy_requests_batched_together_each_continue_their_own_prompt(daemon):
    """Four different prompts decoded in the same batches: a request that read another batch row
    would continue another prompt's list."""
    n = 24
    async with httpx.AsyncClient(base_url=daemon.url, timeout=120) as c:
        deadline = time.monotonic() + 10
        while True:  # an earlier test's last tokens (waiting out their grace) would count as rows here
            stats = (await c.get("/api/stats", params={"model": MODEL})).json()["stats"]
            if stats["tails_pending"] == 0 and stats["running"] == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        before = stats["profile"]
        outs = await asyncio.gather(*(complete(c, p, max_tokens=n, logit_bias=NO_EOS) for p in LISTS))
        # each request's last sampled token joins one more batch after its Done (its KV is then whole)
        want = 4 * n
        deadline = time.monotonic() + 10
        while True:
            after = (await c.get("/api/stats", params={"model": MODEL})).json()["stats"]["profile"]
            if after["decode_rows"] - before["decode_rows"] >= want or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
    for (prompt, items), out in zip(LISTS.items(), outs):
        words = re.findall(r"[a-z]+", out["text"].lower())
        assert [w for w in words if w in items][:3] == items, (prompt, out["text"])
        others = {w for other in LISTS.values() if other is not items for w in other}
        assert not others & set(words), (prompt, out["text"])
    # they shared decode steps: 4 x (n - 1) decode rows (the first token of each comes from its
    # prefill) plus each one's tail row, in far fewer ticks than one request after another would take
    rows = after["decode_rows"] - before["decode_rows"]
    ticks = after["ticks"] - before["ticks"]
    assert rows == want, (before, after)
    assert ticks < rows / 2, f"{rows} decode rows took {ticks} ticks: the requests were not batched together"


async def test_next_turn_of_a_conversation_reuses_the_cached_prefix(daemon):
    msgs = [{"role": "user", "content": "Name a colour of the sea."}]
    async with httpx.AsyncClient(base_url=daemon.url, timeout=120) as c:
        r1 = (await c.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 12, "temperature": 0})).json()
        msgs += [r1["choices"][0]["message"], {"role": "user", "content": "And another one?"}]
        r2 = (await c.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 4, "temperature": 0})).json()
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] < 8  # at most the template's opening, from earlier chats
    assert cached >= r1["usage"]["prompt_tokens"], r2["usage"]  # at least the whole first prompt was not recomputed
    assert cached < r2["usage"]["prompt_tokens"]
