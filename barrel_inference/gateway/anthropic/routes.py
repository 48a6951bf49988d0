"""Anthropic routes: POST /v1/messages (also `?beta=true`), POST /v1/messages/count_tokens, and GET
/v1/models[/{id}] in the Anthropic shape when the request carries `anthropic-version` (without that
header the OpenAI family answers /v1/models as before).

API keys (api_keys, anthropic_api_keys) are checked in front of every family (gateway/auth.py): 401 authentication_error.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Scope

from ...protocol import CountTokens
from ..auth import permit_model
from ..errors import GatewayError, invalid
from ..generation import Result, record_rejected
from ..http import JSONBody, client_request_id, new_id
from ..lifecycle import Adapter, Context, read_body, serve
from .blocks import ContentAssembler, done_usage, message_json, stop_reason_of
from .convert import CACHE_TTL_S, pin_ttl_of, prompt_of, to_submit
from .definition import FAMILY
from .models import list_of, model_info, page
from .stream import MessageStreamEncoder
from .wire import CountTokensRequest, MessagesRequest, WireError, decode

API_MESSAGES = "anthropic.messages"
API_COUNT = "anthropic.count_tokens"
ID_PREFIX = "msg_"


class MessagesAdapter(Adapter):
    family = FAMILY
    api = API_MESSAGES
    id_prefix = ID_PREFIX
    media_type = "text/event-stream"

    def decode(self, body: bytes) -> MessagesRequest:
        try:
            return decode(body, MessagesRequest)
        except WireError as exc:
            raise invalid(str(exc), exc.param) from None

    def to_submit(self, req: MessagesRequest, rid: str):
        return to_submit(req, rid)

    def encoder(self, req: MessagesRequest, ctx: Context) -> "_Encoder":
        return _Encoder(ctx, _ttl_1h(req))

    def response(self, req: MessagesRequest, ctx: Context, result: Result) -> dict:
        blocks = ContentAssembler()
        blocks.feed(result.parts)
        blocks.finish()
        stop_reason, stop_sequence = stop_reason_of(result.done, blocks.tool_calls)
        usage = done_usage(result.done, _ttl_1h(req), ctx.accepted.prompt_tokens, ctx.accepted.cached_tokens)
        return message_json(ctx.id, ctx.model, blocks.content, stop_reason, stop_sequence, usage)


def _ttl_1h(req: MessagesRequest) -> bool:
    return pin_ttl_of(req) >= CACHE_TTL_S["1h"]


class _Encoder:
    """The lifecycle's stream encoder interface over MessageStreamEncoder (which is pure)."""

    keepalive_s = 15.0  # a ping when nothing else was sent for this long (a long prefill)

    def __init__(self, ctx: Context, ttl_1h: bool = False) -> None:
        self.ctx = ctx
        self.enc = MessageStreamEncoder(ctx.id, ctx.model, ttl_1h)

    def start(self) -> bytes:
        a = self.ctx.accepted
        return self.enc.start(a.prompt_tokens, a.cached_tokens)

    def event(self, delta: Any) -> bytes:
        return self.enc.parts(delta.parts)

    def finish(self, done: Any) -> bytes:
        return self.enc.finish(done)

    def error(self, info: Any) -> bytes:
        return self.enc.error(info)

    def keepalive(self) -> bytes:
        return self.enc.ping()


MESSAGES = MessagesAdapter()


async def messages(request: Request) -> Response:
    return await serve(request, MESSAGES)  # keys: gateway/auth.py, in front of every family


async def count_tokens(request: Request) -> Response:
    state = request.app.state
    rid = new_id(ID_PREFIX)
    request_id = client_request_id(request) or rid
    headers = {"x-request-id": request_id}
    try:
        try:
            req = decode(await read_body(request), CountTokensRequest)
        except WireError as exc:
            raise invalid(str(exc), exc.param) from None
        messages_, tools = prompt_of(req)
        await permit_model(request.scope, state, req.model)
        handle = await state.models.get(req.model)
        reply = await handle.call(CountTokens(id=rid, messages=messages_, tools=tools, add_generation_prompt=True))
        if reply.error is not None:
            raise GatewayError.from_info(reply.error)
    except GatewayError as exc:
        record_rejected(state, api=API_COUNT, request_id=request_id, error=exc)
        return FAMILY.error_response(exc.info, headers=headers)
    return JSONBody({"input_tokens": reply.count}, headers=headers)


# ---- /v1/models in the Anthropic shape ------------------------------------------------------


class AnthropicHeaderRoute(Route):
    """A route that matches only requests carrying `anthropic-version`, so the same path can stay another
    family's for every other client (the router goes on to the next route)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and not any(k == b"anthropic-version" for k, _ in scope.get("headers", ())):
            return Match.NONE, {}
        return super().matches(scope)


def _aliases(request: Request) -> dict[str, str]:
    return dict(getattr(request.app.state.settings, "aliases", None) or {})


async def list_models(request: Request) -> Response:
    try:
        items = list_of(request.app.state.registry.list(), _aliases(request))
        q = request.query_params
        return JSONBody(page(items, limit=q.get("limit"), after_id=q.get("after_id"), before_id=q.get("before_id")))
    except GatewayError as exc:
        return FAMILY.error_response(exc.info)


async def get_model(request: Request) -> Response:
    name = request.path_params["model_id"]
    try:
        record = await request.app.state.models.resolve(name)
    except GatewayError as exc:
        return FAMILY.error_response(exc.info)
    target = record.name if record.name != name else None
    return JSONBody(model_info(name, getattr(record, "modified", None), target))


def routes() -> list[Route]:
    return [
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        AnthropicHeaderRoute("/v1/models", list_models, methods=["GET"]),
        AnthropicHeaderRoute("/v1/models/{model_id:path}", get_model, methods=["GET"]),
    ]
