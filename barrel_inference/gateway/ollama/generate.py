"""Ollama's generation routes: POST /api/generate, /api/chat, /api/embed, /api/embeddings.

Streaming answers are NDJSON (`application/x-ndjson`), one object per line, flushed per worker tick; a failure
after the stream started ends it with an `{"error": "..."}` line. Errors before are `{"error": "..."}` with the
fitting status. keep_alive is honoured on every route (gateway/residency.py).
"""

from __future__ import annotations

import math
import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ...protocol import Delta, Done, ErrorCode, Submit
from ..auth import permit_model
from ..process import tool_settings
from ..errors import GatewayError, invalid
from ..family import STATUS, Family, plain_error
from ..generation import Result, record_rejected
from ..http import ClientDisconnected, JSONBody, client_request_id, new_id
from ..lifecycle import Adapter, Context, read_body, serve
from ..keepalive import KeepAliveError, parse_keep_alive
from . import calls, convert, options as opts, stream as enc
from .convert_gen import (
    PartMapper, chat_messages, check_generate, check_think, error_message, generate_messages, schema_of, think_switches,
    tools_of, with_think, with_tool_choice,
)  # fmt: skip
from .wire import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest

API_GENERATE, API_CHAT, API_EMBED = "ollama.generate", "ollama.chat", "ollama.embed"
NDJSON = "application/x-ndjson"


class _Rejected(Exception):
    def __init__(self, error: GatewayError) -> None:
        self.error = error


def _decode(body: bytes, kind: type) -> Any:
    if not body.strip():
        raise _Rejected(invalid("the request body is empty; send a JSON object"))
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        path = str(exc).rsplit("at `$.", 1)
        param = path[1].rstrip("`") if len(path) == 2 else None
        raise _Rejected(invalid(f"invalid request body: {exc}", param)) from None
    except msgspec.DecodeError as exc:
        raise _Rejected(invalid(f"the request body is not valid JSON: {exc}")) from None


def _error(exc: GatewayError, model: str | None, request_id: str | None = None) -> Response:
    info = exc.info
    if info.code == ErrorCode.MODEL_NOT_FOUND:
        info = msgspec.structs.replace(info, message=error_message(info, model))
    headers = {"x-request-id": request_id} if request_id else {}
    wait = getattr(exc, "retry_after", None)
    if wait:
        headers["retry-after"] = str(max(1, math.ceil(wait)))
    return FAMILY.error_response(info, status=STATUS.get(info.code, 500), headers=headers)


class Prepared:
    """What every generation route works out before it runs anything."""

    def __init__(self, request: Request, req: Any, api: str, id_prefix: str) -> None:
        self.request = request
        self.state = request.app.state
        self.req = req
        self.api = api
        self.id = new_id(id_prefix)
        self.request_id = client_request_id(request) or self.id
        self.t0 = time.monotonic_ns()
        self.name = (req.model or req.name or "").strip()
        if not self.name:
            raise _Rejected(invalid("'model' is required", "model"))
        try:
            default = self.state.models.residency.default_keep_alive
            self.keep_alive = parse_keep_alive(req.keep_alive, default) if req.keep_alive is not None else None
        except KeepAliveError as exc:
            raise _Rejected(invalid(f"invalid keep_alive: {exc}", "keep_alive")) from None
        self.options = opts.validate(getattr(req, "options", None))
        self.record: Any = None
        self.load_ns = 0
        self.worker = ""  # the worker's name: the model's, or a variant's with the asked engine settings

    async def resolve(self) -> Any:
        await permit_model(self.request.scope, self.state, self.name)
        self.record = await self.state.models.resolve(self.name)
        return self.record

    async def handle(self, loader: dict | None = None) -> Any:
        """The model's worker (started if needed), or one with the loader options asked for when the model's
        cannot serve them (gateway/variants.py); load_duration is the time a start took."""
        models = self.state.models
        before = {h.name for h in models.handles()}
        t = time.monotonic_ns()
        handle = await models.get(self.name, overrides=loader) if loader else await models.get(self.name)
        if handle.name not in before:
            self.load_ns = time.monotonic_ns() - t
        self.worker = handle.name
        return handle

    def capabilities(self) -> list[str]:
        """The resolved model's capabilities, with the tool format and thinking markers its worker uses."""
        settings = getattr(self.state, "settings", None)
        tools = tool_settings(settings, self.record) if settings is not None else None
        return convert.capabilities(self.record, tools)

    def engine(self) -> opts.Options:
        return opts.to_engine(getattr(self.record, "parameters", None) or {}, self.options)

    def total_ns(self) -> int:
        return time.monotonic_ns() - self.t0

    def figures(self, done: Done) -> enc.Figures:
        return enc.Figures.of(done, total_ns=self.total_ns(), load_ns=self.load_ns)


async def _load_or_unload(p: Prepared, make_final) -> Response:
    """An empty prompt / no messages: load the model (done_reason load), or with keep_alive 0 unload it."""
    models = p.state.models
    if p.keep_alive == 0:
        await models.residency.unload_when_idle(p.record.name)
        return JSONBody(make_final("unload"))
    handle = await p.handle()
    if p.keep_alive is not None:
        handle.keep_alive = p.keep_alive
        if handle.in_flight == 0:
            models.residency.idle(handle)
    return JSONBody(make_final("load"))


async def _load_only(p: Prepared) -> None:
    """An embedding request with no input: load the model, or with keep_alive 0 unload it."""
    if p.keep_alive == 0:
        await p.state.models.residency.unload_when_idle(p.record.name)
    else:
        await p.handle()


# ---- generate -------------------------------------------------------------------------------------------
async def generate(request: Request) -> Response:
    p: Prepared | None = None
    try:
        req = _decode(await read_body(request), GenerateRequest)
        p = Prepared(request, req, API_GENERATE, "gen-")
        check_generate(req)
        schema = schema_of(req.format)
        record = await p.resolve()
        check_think(req.think, p.capabilities(), p.name)
        if not req.prompt and not req.context:
            return await _load_or_unload(p, lambda reason: enc.generate_final(p.name, reason, None))
        e = p.engine()
        handle = await p.handle(e.loader)
        prompt_tokens = await _generate_prompt(handle, req, record)
    except _Rejected as exc:
        return _rejected(request, API_GENERATE, exc.error, p)
    except GatewayError as exc:
        return _rejected(request, API_GENERATE, exc, p)
    submit = Submit(
        id=p.id, prompt_tokens=prompt_tokens, sampling=e.sampling, stop=e.stop, max_tokens=e.max_tokens,
        json_schema=schema, ignore_eos=e.ignore_eos, want_tokens=not req.raw,
    )  # fmt: skip
    with_think(submit, req.think)
    context_base = None if req.raw else prompt_tokens

    def chunk(text: str, thinking: str, _calls: list[dict]) -> dict | None:
        return enc.generate_chunk(p.name, text, thinking) if text or thinking else None

    def final(done: Done, c: enc.Collected, streamed: bool) -> dict:
        context = None if context_base is None else context_base + c.tokens
        return enc.generate_final(
            p.name, enc.done_reason(done), p.figures(done), response="" if streamed else c.text,
            thinking="" if streamed else c.thinking, context=context,
        )  # fmt: skip

    return await _run(p, submit, req.stream, chunk, final)


async def _generate_prompt(handle: Any, req: GenerateRequest, record: Any) -> list[int]:
    """Token ids of the prompt: the earlier `context` ids, then this prompt (rendered by the chat template
    unless raw). Returned in the final chunk's `context` with the reply's ids, so a next call continues it."""
    if req.raw:
        text, add_bos = req.prompt or "", not req.context
    else:
        text = await calls.render(handle, generate_messages(req, record), think_switches(req.think))
        bos = handle.hello.bos_token
        add_bos = not req.context and not (bos and text.startswith(bos))
    tokens = await calls.tokenize(handle, text, add_special=add_bos, parse_special=True)
    context = list(req.context or [])
    n_vocab = handle.hello.n_vocab
    bad = [t for t in context if not 0 <= t < n_vocab]
    if bad:
        raise invalid(f"context holds token id {bad[0]}, outside the vocabulary (0..{n_vocab - 1})", "context")
    return context + list(tokens)


# ---- chat -------------------------------------------------------------------------------------------------
async def chat(request: Request) -> Response:
    p: Prepared | None = None
    try:
        req = _decode(await read_body(request), ChatRequest)
        p = Prepared(request, req, API_CHAT, "chat-")
        schema = schema_of(req.format)
        tools = tools_of(req.tools)
        record = await p.resolve()
        caps = p.capabilities()
        check_think(req.think, caps, p.name)
        if tools and "tools" not in caps:
            raise invalid(f"\"{p.name}\" does not support tools", "tools")
        messages = chat_messages(req, record)
        if not req.messages:
            return await _load_or_unload(p, lambda reason: enc.chat_final(p.name, reason, None))
        e = p.engine()
        await p.handle(e.loader)
    except _Rejected as exc:
        return _rejected(request, API_CHAT, exc.error, p)
    except GatewayError as exc:
        return _rejected(request, API_CHAT, exc, p)
    submit = Submit(
        id=p.id, messages=messages, tools=tools, sampling=e.sampling, stop=e.stop, max_tokens=e.max_tokens,
        json_schema=schema, ignore_eos=e.ignore_eos,
    )  # fmt: skip
    with_think(submit, req.think)
    try:
        with_tool_choice(submit, req.tool_choice, req.parallel_tool_calls)
    except GatewayError as exc:
        return _rejected(request, API_CHAT, exc, p)

    def chunk(text: str, thinking: str, calls: list[dict]) -> dict | None:
        if not (text or thinking or calls):
            return None
        return enc.chat_chunk(p.name, enc.message(text, thinking, calls))

    def final(done: Done, c: enc.Collected, streamed: bool) -> dict:
        msg = enc.message() if streamed else enc.message(c.text, c.thinking, c.tool_calls)
        return enc.chat_final(p.name, enc.done_reason(done), p.figures(done), msg)

    return await _run(p, submit, req.stream, chunk, final)


# ---- running one request: an adapter on the family-neutral lifecycle ---------------------------------------
FAMILY = Family("ollama", ("/api",), render_error=plain_error)


class NDJSONEncoder:
    """The lifecycle's stream encoder for Ollama: one object per line, parts mapped as Ollama sends them."""

    def __init__(self, chunk, final) -> None:
        self.mapper, self.collected = PartMapper(), enc.Collected()
        self._chunk, self._final = chunk, final

    def start(self) -> bytes:
        return b""

    def event(self, delta: Delta) -> bytes:
        text, thinking, tool_calls = self.mapper.feed(delta)
        self.collected.tokens.extend(delta.tokens)
        obj = self._chunk(text, thinking, tool_calls)
        return enc.line(obj) if obj is not None else b""

    def finish(self, done: Done) -> bytes:
        return enc.line(self._final(done, self.collected, True))

    def error(self, info) -> bytes:
        return enc.line({"error": info.message})


class PreparedAdapter(Adapter):
    """One request whose Submit the route already built (prompt tokens, the worker to use, keep_alive)."""

    family = FAMILY
    media_type = NDJSON
    model_access_checked = True  # Prepared.resolve did, by the name the client sent

    def __init__(self, p: Prepared, submit: Submit, stream: bool, chunk, final) -> None:
        self.p, self.submit, self.stream = p, submit, stream
        self.api, self.id_prefix = p.api, p.id.split("-", 1)[0] + "-"
        self._chunk, self._final = chunk, final

    def decode(self, body: bytes) -> Any:
        return self.p.req

    def model(self, req: Any) -> str:
        return self.p.worker

    def streaming(self, req: Any) -> bool:
        return self.stream

    def to_submit(self, req: Any, rid: str) -> Submit:
        self.p.state.models.residency.request_keep_alive(rid, self.p.keep_alive)
        return msgspec.structs.replace(self.submit, id=rid)

    def encoder(self, req: Any, ctx: Context) -> NDJSONEncoder:
        return NDJSONEncoder(self._chunk, self._final)

    def response(self, req: Any, ctx: Context, result: Result) -> dict:
        mapper, c = PartMapper(), enc.Collected()
        text, thinking, _ = mapper.feed(Delta(id=ctx.id, parts=result.parts))
        c.text, c.thinking, c.tool_calls, c.tokens = text, thinking, mapper.tool_calls, list(result.tokens)
        return self._final(result.done, c, False)


def _rejected(request: Request, api: str, exc: GatewayError, p: Prepared | None) -> Response:
    rid = p.request_id if p is not None else (client_request_id(request) or new_id("req-"))
    record_rejected(request.app.state, api=api, request_id=rid, error=exc, model=p.name if p else None)
    return _error(exc, p.name if p else None, rid)


async def _run(p: Prepared, submit: Submit, stream: bool, chunk, final) -> Response:
    return await serve(p.request, PreparedAdapter(p, submit, stream, chunk, final))


# ---- embeddings -------------------------------------------------------------------------------------------
async def embed(request: Request) -> Response:
    """POST /api/embed: input (a string or strings) -> embeddings (L2-normalised), truncated to fit by default."""
    p: Prepared | None = None
    try:
        req = _decode(await read_body(request), EmbedRequest)
        p = Prepared(request, req, API_EMBED, "emb-")
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        texts = [t for t in texts if t != ""] if isinstance(req.input, str) else texts
        if req.dimensions is not None and req.dimensions <= 0:
            raise invalid(f"dimensions must be positive, got {req.dimensions}", "dimensions")
        await p.resolve()
        if not texts:
            await _load_only(p)
            return JSONBody({"model": p.name, "embeddings": []})
        if any(t == "" for t in texts):
            raise invalid("input must not contain empty strings", "input")
        handle = await p.handle()
        vectors, count = await _embed(request, handle, texts, truncate=req.truncate)
        if req.dimensions is not None:
            vectors = [_shorten(v, req.dimensions) for v in vectors]
    except _Rejected as exc:
        return _rejected(request, API_EMBED, exc.error, p)
    except GatewayError as exc:
        return _rejected(request, API_EMBED, exc, p)
    except ClientDisconnected:
        return Response(status_code=499)
    _after_call(p, handle)
    return JSONBody({
        "model": p.name, "embeddings": vectors, "total_duration": p.total_ns(), "load_duration": p.load_ns,
        "prompt_eval_count": count,
    })  # fmt: skip


async def embeddings(request: Request) -> Response:
    """POST /api/embeddings (the older route): prompt -> embedding."""
    p: Prepared | None = None
    try:
        req = _decode(await read_body(request), EmbeddingsRequest)
        p = Prepared(request, req, API_EMBED, "emb-")
        await p.resolve()
        if not req.prompt:
            await _load_only(p)
            return JSONBody({"embedding": []})
        handle = await p.handle()
        vectors, _ = await _embed(request, handle, [req.prompt], truncate=True)
    except _Rejected as exc:
        return _rejected(request, API_EMBED, exc.error, p)
    except GatewayError as exc:
        return _rejected(request, API_EMBED, exc, p)
    except ClientDisconnected:
        return Response(status_code=499)
    _after_call(p, handle)
    return JSONBody({"embedding": vectors[0]})


async def _embed(request: Request, handle: Any, texts: list[str], *, truncate: bool) -> tuple[list[list[float]], int]:
    vectors, count, error = await calls.embed(request, handle.name, texts)
    if error is not None and error.code == ErrorCode.CONTEXT_LENGTH and truncate:
        limit = max(1, handle.hello.n_ctx - 2)  # room for BOS / EOS
        cut = []
        for text in texts:
            toks = await calls.tokenize(handle, text, add_special=False, parse_special=False)
            if len(toks) > limit:
                text = await calls.detokenize(handle, toks[:limit])
            cut.append(text)
        vectors, count, error = await calls.embed(request, handle.name, cut)
    if error is not None:
        raise GatewayError.from_info(error)
    return vectors or [], count


def _shorten(vec: list[float], n: int) -> list[float]:
    """Matryoshka-style: the first n dimensions, renormalised (what Ollama does with `dimensions`)."""
    head = vec[:n]
    norm = math.sqrt(sum(x * x for x in head)) or 1.0
    return [x / norm for x in head]


def _after_call(p: Prepared, handle: Any) -> None:
    """A call (no Submit) used the model: its keep_alive applies from now, as a finished request's would."""
    if p.keep_alive is None:
        return
    residency = p.state.models.residency
    residency.request_keep_alive(p.id, p.keep_alive)
    if handle.in_flight == 0:
        residency.released(handle, p.id)
    else:
        handle.keep_alive = p.keep_alive
        residency.forget_request(p.id)
