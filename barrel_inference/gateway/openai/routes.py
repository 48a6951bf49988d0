"""OpenAI routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, GET /v1/models[/{id}]."""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...protocol import Call, Delta, Submit
from ..errors import GatewayError, invalid
from ..generation import Generation, record_embedding, record_rejected
from ..http import ClientDisconnected, EventStreamResponse, JSONBody, client_request_id, new_id, until_disconnect
from .convert import (
    chat_response,
    chat_to_submit,
    completion_response,
    completion_to_submit,
    done_error,
    error_body,
    error_status,
    model_json,
)
from .stream import ChatStreamEncoder, CompletionStreamEncoder
from .wire import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, WireError, decode

API_CHAT = "openai.chat"
API_COMPLETIONS = "openai.completions"
API_EMBEDDINGS = "openai.embeddings"


def error_response(exc: GatewayError, request_id: str | None = None) -> Response:
    status = error_status(exc.code)
    wait = getattr(exc, "retry_after", None)
    headers = {"retry-after": str(max(1, math.ceil(wait or 1)))} if status == 503 else {}
    if request_id:
        headers["x-request-id"] = request_id
    return JSONBody(error_body(exc.info), status_code=status, headers=headers)


async def _serve(request: Request, api: str, id_prefix: str, wire_type, to_submit, encoder, to_response) -> Response:
    """Decode one generation request of either endpoint, then run it (plain or streamed)."""
    rid = new_id(id_prefix)
    try:
        req = decode(await request.body(), wire_type)
        submit = to_submit(req, rid)
    except WireError as exc:
        return _rejected(request, api, rid, invalid(str(exc), exc.param))
    except GatewayError as exc:
        return _rejected(request, api, rid, exc)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return await _generate(
        request, api, req.model, submit, req.stream,
        lambda created: encoder(rid, req.model, created, include_usage), to_response,
    )  # fmt: skip


async def chat_completions(request: Request) -> Response:
    return await _serve(request, API_CHAT, "chatcmpl-", ChatCompletionRequest, chat_to_submit, ChatStreamEncoder, chat_response)


async def completions(request: Request) -> Response:
    return await _serve(
        request, API_COMPLETIONS, "cmpl-", CompletionRequest, completion_to_submit, CompletionStreamEncoder, completion_response
    )


def _rejected(request: Request, api: str, rid: str, exc: GatewayError) -> Response:
    request_id = client_request_id(request) or rid
    record_rejected(request.app.state, api=api, request_id=request_id, error=exc)
    return error_response(exc, request_id)


async def _generate(
    request: Request,
    api: str,
    model: str,
    submit: Submit,
    stream: bool,
    make_encoder: Callable[[int], Any],
    make_response: Callable[..., dict],
) -> Response:
    state = request.app.state
    created = int(time.time())
    request_id = client_request_id(request) or submit.id
    headers = {"x-request-id": request_id}
    opening = Generation.open(state, api=api, model=model, submit=submit, stream_response=stream, request_id=request_id)
    try:
        gen = await until_disconnect(request, opening)
    except GatewayError as exc:
        return error_response(exc, request_id)
    except ClientDisconnected:
        return Response(status_code=499)
    if stream:
        return EventStreamResponse(_sse_body(gen, make_encoder(created)), on_close=gen.close, headers=headers)
    try:
        text, _tokens, done = await until_disconnect(request, gen.collect())
    except ClientDisconnected:
        return Response(status_code=499)
    except GatewayError as exc:
        gen.close(exc)
        return error_response(exc, request_id)
    finally:
        gen.close()
    if (info := done_error(done)) is not None:
        return error_response(GatewayError.from_info(info), request_id)
    return JSONBody(make_response(submit.id, model, created, text, done), headers=headers)


async def _sse_body(gen: Generation, enc: Any):
    try:
        yield enc.start()
        async for event in gen.events():
            if isinstance(event, Delta):
                if chunk := enc.text(event.text):
                    yield chunk
            elif (info := done_error(event)) is not None:
                yield enc.error(info)
            else:
                yield enc.finish(event)
    finally:
        gen.close()


async def embeddings(request: Request) -> Response:
    rid = new_id("emb-")
    t0 = time.monotonic()
    model, inputs = "", 0
    request_id = client_request_id(request) or rid

    def failed(exc: GatewayError) -> Response:
        record_embedding(request.app.state, api=API_EMBEDDINGS, model=model, request_id=request_id, inputs=inputs, prompt_tokens=None, t0=t0, error=exc)
        return error_response(exc, request_id)

    try:
        req = decode(await request.body(), EmbeddingRequest)
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        inputs = len(texts)
        if not texts:
            raise invalid("input must not be empty", "input")
        if req.encoding_format not in (None, "float"):
            raise invalid("only encoding_format 'float' is supported", "encoding_format")
        if req.dimensions is not None:
            raise invalid("dimensions is not supported: the model's embedding size is fixed", "dimensions")
        handle = await request.app.state.models.get(req.model)
        model = handle.name
        result = await handle.call(Call(id=rid, op="embed", texts=texts))
    except WireError as exc:
        return failed(invalid(str(exc), exc.param))
    except GatewayError as exc:
        return failed(exc)
    if result.error is not None:
        return failed(GatewayError.from_info(result.error))
    record_embedding(request.app.state, api=API_EMBEDDINGS, model=model, request_id=request_id, inputs=inputs, prompt_tokens=result.count, t0=t0)
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(result.embeddings or [])]
    usage = {"prompt_tokens": result.count or 0, "total_tokens": result.count or 0}
    return JSONBody({"object": "list", "data": data, "model": req.model, "usage": usage}, headers={"x-request-id": request_id})


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


def routes() -> list[Route]:
    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
    ]
