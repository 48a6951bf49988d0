"""OpenAI routes: POST /v1/chat/completions and /v1/completions (adapters on the shared lifecycle),
POST /v1/embeddings, GET /v1/models[/{id}]."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...protocol import Embed, Submit
from ..errors import GatewayError, invalid
from ..family import Family
from starlette.requests import ClientDisconnect

from ..generation import record_embedding
from ..lifecycle import Adapter, Context, Result, admitted_call, endpoint, read_body
from ..http import ClientDisconnected, JSONBody, client_request_id, new_id
from .convert import (
    chat_logprobs_json, chat_response, chat_to_submit, completion_logprobs_json, completion_response, completion_to_submit,
    echo_text, embedding_inputs, embedding_json, error_body, fingerprint, model_json,
)  # fmt: skip
from .stream import ChatStreamEncoder, CompletionStreamEncoder
from .wire import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, WireError, decode

API_CHAT = "openai.chat"
API_COMPLETIONS = "openai.completions"
API_EMBEDDINGS = "openai.embeddings"
EMBED_TIMEOUT_S = 600.0  # many long inputs on a CPU take a while; a silent worker is caught by the heartbeat

FAMILY = Family("openai", ("/v1",), render_error=error_body)


def decode_or_invalid(body: bytes, wire_type: type) -> Any:
    try:
        return decode(body, wire_type)
    except WireError as exc:
        raise invalid(str(exc), exc.param) from None


class _OpenAIAdapter(Adapter):
    family = FAMILY
    wire_type: type = ChatCompletionRequest

    def decode(self, body: bytes) -> Any:
        return decode_or_invalid(body, self.wire_type)

    @staticmethod
    def include_usage(req: Any) -> bool:
        return bool(req.stream_options and req.stream_options.include_usage)


class ChatAdapter(_OpenAIAdapter):
    api = API_CHAT
    id_prefix = "chatcmpl-"
    wire_type = ChatCompletionRequest

    def to_submit(self, req: ChatCompletionRequest, rid: str) -> Submit:
        return chat_to_submit(req, rid)

    def encoder(self, req: ChatCompletionRequest, ctx: Context) -> ChatStreamEncoder:
        return ChatStreamEncoder(ctx.id, ctx.model, ctx.created, self.include_usage(req), fingerprint(ctx.resolved_model, ctx.hello))

    def response(self, req: ChatCompletionRequest, ctx: Context, result: Result) -> dict:
        body = chat_response(ctx.id, ctx.model, ctx.created, result.text, result.done, result.parts)
        body["system_fingerprint"] = fingerprint(ctx.resolved_model, ctx.hello)
        if req.logprobs:
            body["choices"][0]["logprobs"] = chat_logprobs_json(result.logprobs)
        return body


class CompletionAdapter(_OpenAIAdapter):
    api = API_COMPLETIONS
    id_prefix = "cmpl-"
    wire_type = CompletionRequest

    def to_submit(self, req: CompletionRequest, rid: str) -> Submit:
        return completion_to_submit(req, rid)

    def encoder(self, req: CompletionRequest, ctx: Context) -> CompletionStreamEncoder:
        enc = CompletionStreamEncoder(ctx.id, ctx.model, ctx.created, self.include_usage(req), fingerprint(ctx.resolved_model, ctx.hello))
        if req.echo:
            enc.echo = echo_text(req)
        return enc

    def response(self, req: CompletionRequest, ctx: Context, result: Result) -> dict:
        echo = echo_text(req) if req.echo else ""
        body = completion_response(ctx.id, ctx.model, ctx.created, echo + result.text, result.done)
        body["system_fingerprint"] = fingerprint(ctx.resolved_model, ctx.hello)
        if req.logprobs is not None:
            body["choices"][0]["logprobs"] = completion_logprobs_json(result.logprobs, len(echo))
        return body


def error_response(exc: GatewayError, request_id: str | None = None) -> Response:
    return FAMILY.error(exc, headers={"x-request-id": request_id} if request_id else None)


async def embeddings(request: Request) -> Response:
    rid = new_id("emb-")
    t0 = time.monotonic()
    request_id = client_request_id(request) or rid
    headers = {"x-request-id": request_id}
    state = request.app.state
    model, n_inputs = "", 0
    try:
        req = decode_or_invalid(await read_body(request), EmbeddingRequest)
        inputs = embedding_inputs(req)
        n_inputs = len(inputs)
        model = await _model_name(state, req.model)
        result = await admitted_call(request, req.model, Embed(id=rid, inputs=inputs), timeout=EMBED_TIMEOUT_S)
        if result.error is not None:
            raise GatewayError.from_info(result.error)
        data = [embedding_json(v, i, req.encoding_format, req.dimensions) for i, v in enumerate(result.embeddings)]
    except GatewayError as exc:
        record_embedding(state, api=API_EMBEDDINGS, model=model, request_id=request_id, inputs=n_inputs, prompt_tokens=None, t0=t0, error=exc)
        return FAMILY.error(exc, headers=headers)
    except (ClientDisconnected, ClientDisconnect):
        return Response(status_code=499)
    record_embedding(state, api=API_EMBEDDINGS, model=model, request_id=request_id, inputs=n_inputs, prompt_tokens=result.count, t0=t0)
    usage = {"prompt_tokens": result.count, "total_tokens": result.count}
    return JSONBody({"object": "list", "data": data, "model": req.model, "usage": usage}, headers=headers)


async def _model_name(state: Any, requested: str) -> str:
    """The registry's name for `requested` (what metrics and logs are labelled with); GatewayError if unknown."""
    return (await state.models.resolve(requested)).name


async def list_models(request: Request) -> Response:
    records = request.app.state.registry.list()
    data = [model_json(r.name, _created(r)) for r in records]
    return JSONBody({"object": "list", "data": data})


async def get_model(request: Request) -> Response:
    name = request.path_params["model_id"]
    try:
        record = await request.app.state.models.resolve(name)
    except GatewayError as exc:
        return error_response(exc)
    return JSONBody(model_json(name, _created(record)))


def _created(record: Any) -> int:
    modified = getattr(record, "modified", None)
    if modified is None:
        return 0
    if hasattr(modified, "timestamp"):
        return int(modified.timestamp())
    return int(modified)


def responses_routes() -> list[Route]:
    from .responses_routes import routes as responses

    return responses()


def routes() -> list[Route]:
    return [
        Route("/v1/chat/completions", endpoint(ChatAdapter()), methods=["POST"]),
        Route("/v1/completions", endpoint(CompletionAdapter()), methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
        *responses_routes(),
    ]


FAMILY.routes = routes
