"""The official `ollama` Python client against the live daemon (gateway + worker processes) on the tiny GGUF:
generation, chat, embeddings, the model lifecycle (create, edit, show, copy, delete, ps) and keep_alive."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from .daemon import Daemon

ollama = pytest.importorskip("ollama")


@pytest.fixture(scope="module")
def daemon(tiny_gguf, tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("daemon"), {"tiny": tiny_gguf}, n_seq_max=2, n_ctx=1024, threads=1)
    with d:
        yield d


@pytest.fixture
def client(daemon):
    return ollama.AsyncClient(host=daemon.url, timeout=60)


async def wait_for(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


OPTS = {"temperature": 0, "num_predict": 8}


async def test_generate_plain_stream_and_context(client):
    r = await client.generate(model="tiny", prompt="hello", options=OPTS)
    assert r.done and r.done_reason in ("stop", "length") and 0 < r.eval_count <= 8
    assert r.prompt_eval_count > 0 and r.total_duration >= r.eval_duration > 0 and r.context
    chunks = [c async for c in await client.generate(model="tiny", prompt="hello", options=OPTS, stream=True)]
    assert chunks[-1].done and all(not c.done for c in chunks[:-1])
    assert "".join(c.response for c in chunks) == r.response  # greedy: the same text streamed
    again = await client.generate(model="tiny", prompt="more", context=r.context, options=OPTS)
    assert again.context[: len(r.context)] == list(r.context)  # continues the earlier token ids


async def test_generate_format_json_and_schema(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    r = await client.generate(model="tiny", prompt="answer", format=schema, options={"temperature": 0, "num_predict": 200})
    assert r.done_reason == "stop", r.response
    assert isinstance(json.loads(r.response)["ok"], bool)
    r = await client.generate(model="tiny", prompt="answer", format="json", options={"temperature": 0, "num_predict": 200})
    if r.done_reason == "stop":
        assert isinstance(json.loads(r.response), dict)
    else:
        assert r.response.lstrip().startswith("{")


async def test_chat_and_mistyped_option(client):
    r = await client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options=OPTS)
    assert r.message.role == "assistant" and r.done and r.eval_count <= 8
    with pytest.raises(ollama.ResponseError) as e:
        await client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options={"temperature": "warm"})
    assert e.value.status_code == 400 and "temperature" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        await client.chat(model="absent", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404 and "try pulling it first" in e.value.error


async def test_embed_both_routes(client):
    r = await client.embed(model="tiny", input=["hello", "world"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 64
    assert sum(x * x for x in r.embeddings[0]) == pytest.approx(1.0, abs=1e-4)
    old = await client.embeddings(model="tiny", prompt="hello")
    assert old.embedding == pytest.approx(r.embeddings[0], abs=1e-5)


async def test_create_edit_show_copy_delete(client):
    mf = 'FROM tiny\nPARAMETER temperature 0\nPARAMETER num_predict 4\nSYSTEM """Be brief."""\n'
    progress = [p async for p in await client._request(ollama._types.ProgressResponse, "POST", "/api/create",
                                                       json={"model": "brief", "modelfile": mf}, stream=True)]  # fmt: skip
    assert progress[-1].status == "success"
    r = await client.generate(model="brief", prompt="hello")
    assert r.eval_count <= 4  # the created model's PARAMETER num_predict applies
    shown = await client.show("brief")
    assert "completion" in shown.capabilities and "num_predict" in shown.parameters
    def from_line(text: str) -> str:
        return next(x for x in text.splitlines() if x.startswith("FROM "))

    assert from_line(shown.modelfile) == from_line((await client.show("tiny")).modelfile)  # the same GGUF, shared
    await client.create(model="brief2", from_="brief", parameters={"num_predict": 2})
    assert (await client.generate(model="brief2", prompt="hello")).eval_count <= 2
    assert (await client.copy("brief2", "brief3")).status == "success"
    assert (await client.delete("brief2")).status == "success"
    names = {m.model for m in (await client.list()).models}
    assert "brief3:latest" in names and "brief2:latest" not in names


async def test_keep_alive_zero_unloads_and_expiry_stops_the_worker(client, daemon):
    await client.generate(model="tiny", prompt="x", options={"num_predict": 1})
    await wait_for(lambda: len(daemon.children()) >= 1)
    for m in (await client.ps()).models:  # each loaded model, unloaded the way Ollama's clients do it
        r = await client.generate(model=m.model, keep_alive=0)
        assert r.done_reason == "unload"
    await wait_for(lambda: daemon.children() == [])
    assert (await client.ps()).models == []
    # load with keep_alive 60 s, then a request with keep_alive 1 s: ps moves expires_at, the worker exits
    await client.generate(model="tiny", keep_alive=60)
    first = (await client.ps()).models[0].expires_at
    await client.generate(model="tiny", prompt="x", options={"num_predict": 1}, keep_alive="1s")
    second = (await client.ps()).models[0].expires_at
    assert second < first
    await wait_for(lambda: daemon.children() == [], timeout=15)
    assert (await client.ps()).models == []


async def test_pull_from_a_local_registry_then_generate(tiny_gguf, tmp_path):
    from tests.registry.registry_fakes import FakeOllama, FileHost

    async with FileHost() as cdn, FakeOllama(cdn) as reg:
        reg.add_model("library/tiny:pulled", tiny_gguf.read_bytes(), params={"num_predict": 3, "temperature": 0})
        d = Daemon(tmp_path, {}, n_seq_max=1, n_ctx=512, threads=1, extra=f'ollama_registry = "{reg.url}"')
        with d:
            c = ollama.AsyncClient(host=d.url, timeout=60)
            progress = [p async for p in await c.pull("tiny:pulled", stream=True)]
            assert progress[0].status == "pulling manifest" and progress[-1].status == "success"
            assert [m.model for m in (await c.list()).models] == ["tiny:pulled"]
            r = await c.generate(model="tiny:pulled", prompt="hi")
            assert r.done and r.eval_count <= 3  # the registry's params layer applies


@pytest.mark.gemma
async def test_gemma_generate_raw_and_templated_with_context(tmp_path, gemma_gguf):
    """Real text through Ollama's generate on the real Gemma 3 270M: raw continuation, templated prompt (BOS
    written by the template, not twice), and `context` continuing the earlier answer."""
    with Daemon(tmp_path, {"gemma3:270m": gemma_gguf}, n_seq_max=2, n_ctx=1024, threads=2) as d:
        c = ollama.AsyncClient(host=d.url, timeout=180)
        raw = await c.generate(model="gemma3:270m", prompt="The capital of France is", raw=True,
                               options={"temperature": 0, "num_predict": 8})  # fmt: skip
        assert raw.response.strip() and raw.eval_count == 8 and raw.context is None
        r = await c.generate(model="gemma3:270m", prompt="Name a colour of the sea.", options={"temperature": 0, "num_predict": 12})
        assert r.response.strip() and r.context[0] == 2 and r.context[1] != 2  # one BOS
        more = await c.generate(model="gemma3:270m", prompt="And another?", context=r.context, options={"temperature": 0, "num_predict": 12})
        assert more.context[: len(r.context)] == list(r.context) and more.prompt_eval_count < len(more.context)


def _text_of(ids: list[int]) -> str:
    """The tiny vocabulary's text of token ids: bytes, the merges, then the special tokens (tinymodel.py)."""
    from tinymodel import MERGES, SPECIALS

    merged = [(a + b).replace("Ġ", " ") for a, b in MERGES]
    return b"".join(bytes([t]) if t < 256 else (merged + SPECIALS)[t - 256].encode() for t in ids).decode("utf-8", "replace")


async def test_a_model_created_with_a_template_renders_with_it(client):
    """A Modelfile TEMPLATE (Go text/template) becomes the model's chat template: /api/generate's `context` holds
    the prompt as that template rendered it, /api/chat renders the conversation with it; a template that fails
    on a request's data is that request's 400, and the model goes on serving."""
    template = ('{{- range $i, $m := .Messages }}{{ if eq $m.Role "user" }}Q{{ $i }}: {{ $m.Content }}\n'
                '{{- else }}A{{ $i }}: {{ $m.Content }}\n{{- end }}{{ end }}\nA: ')  # fmt: skip
    progress = [p async for p in await client.create(model="qa", from_="tiny", template=template, stream=True)]
    assert progress[-1].status == "success"
    assert (await client.show("qa")).template == template
    r = await client.generate(model="qa", prompt="hello there", options=OPTS)
    prompt = _text_of(r.context)
    assert prompt.startswith("Q0: hello there\nA: ") and "<|im_start|>" not in prompt  # not the GGUF's ChatML
    chat = await client.chat(model="qa", messages=[{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
                                                   {"role": "user", "content": "three"}], options=OPTS)  # fmt: skip
    assert chat.done and chat.prompt_eval_count > 0
    await client.create(model="qa-broken", from_="tiny", template="{{ index .Messages 5 }}")
    with pytest.raises(ollama.ResponseError) as info:
        await client.generate(model="qa-broken", prompt="x", options=OPTS)
    assert info.value.status_code == 400 and "index out of range" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        await client.create(model="qa-bad", from_="tiny", template='{{ template "x" }}')
    assert info.value.status_code == 400 and "{{ template }} is not supported" in info.value.error
    again = await client.generate(model="qa", prompt="hello there", options=OPTS)
    assert again.done
