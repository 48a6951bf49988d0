"""The Responses API: POST /v1/responses (an adapter on the shared lifecycle), GET and DELETE
/v1/responses/{id}, GET /v1/responses/{id}/input_items."""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...protocol import ErrorCode, ErrorInfo, Submit
from ..errors import GatewayError, invalid
from ..lifecycle import Adapter, Context, Result, serve
from ..http import JSONBody
from .convert import error_body
from .responses_convert import OutputBuilder, item_id, response_json, status_of, to_submit
from .responses_store import ResponseStore, StoredResponse, make_store
from .responses_stream import ResponsesStreamEncoder
from .responses_wire import ResponsesRequest, WireError, decode

API_RESPONSES = "openai.responses"
_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def responses_error_body(info: ErrorInfo, status: int | None = None) -> dict:
    """OpenAI's envelope; an unknown previous_response_id has its own code, as OpenAI gives it."""
    body = error_body(info, status)
    if info.param == "previous_response_id" and info.code == ErrorCode.INVALID_REQUEST:
        body["error"]["code"] = "previous_response_not_found"
    return body


def _family():
    from .routes import FAMILY

    return dataclasses.replace(FAMILY, render_error=responses_error_body)


def store_of(state: Any) -> ResponseStore:
    store = getattr(state, "response_store", None)
    if store is None:
        store = state.response_store = make_store(state.settings)
    return store


def with_ids(items: list[dict]) -> list[dict]:
    """Input items as stored and listed: each with an id (kept where the client gave one)."""
    out = []
    for item in items:
        item = dict(item)
        kind = item.get("type", "message")
        item.setdefault("type", kind)
        item.setdefault("id", item_id(_ITEM_PREFIX.get(kind, "item")))
        out.append(item)
    return out


class ResponsesAdapter(Adapter):
    """One request's adapter (it carries the conversation it continues to the store at the end)."""

    api = API_RESPONSES
    id_prefix = "resp_"
    media_type = "text/event-stream"

    def __init__(self, store: ResponseStore) -> None:
        self.family = _family()
        self.store = store
        self.conversation: list[dict] = []  # the input items this response answers, history first

    def decode(self, body: bytes) -> ResponsesRequest:
        try:
            return decode(body)
        except WireError as exc:
            raise invalid(str(exc), exc.param) from None

    def to_submit(self, req: ResponsesRequest, rid: str) -> Submit:
        history: list[dict] = []
        if req.previous_response_id is not None:
            previous = self.store.get(req.previous_response_id)
            if previous is None:
                raise invalid(
                    f"Previous response with id '{req.previous_response_id}' not found (never stored, expired or deleted).",
                    "previous_response_id",
                )
            history = previous.conversation()
        submit = to_submit(req, rid, history)
        self.conversation = with_ids(history) if history else []
        new = [{"type": "message", "role": "user", "content": req.input}] if isinstance(req.input, str) else list(req.input)
        self.conversation += with_ids(new)
        return submit

    def _keep(self, req: ResponsesRequest, response: dict) -> None:
        if req.store:
            self.store.put(response["id"], StoredResponse(response=response, input_items=self.conversation))

    def encoder(self, req: ResponsesRequest, ctx: Context) -> ResponsesStreamEncoder:
        return ResponsesStreamEncoder(ctx.id, req, ctx.created, on_finish=lambda final: self._keep(req, final))

    def response(self, req: ResponsesRequest, ctx: Context, result: Result) -> dict:
        out = OutputBuilder()
        for part in result.parts:
            out.add(part)
        status, _ = status_of(result.done)
        final = response_json(ctx.id, req, ctx.created, output=out.finished(status == "incomplete"), done=result.done)
        self._keep(req, final)
        return final


async def create(request: Request) -> Response:
    return await serve(request, ResponsesAdapter(store_of(request.app.state)))


def _not_found(rid: str) -> Response:
    info = ErrorInfo(ErrorCode.NOT_FOUND, f"No response with id '{rid}' found.", param="response_id")
    return _family().error_response(info)


async def get_response(request: Request) -> Response:
    rid = request.path_params["response_id"]
    stored = store_of(request.app.state).get(rid)
    return JSONBody(stored.response) if stored is not None else _not_found(rid)


async def delete_response(request: Request) -> Response:
    rid = request.path_params["response_id"]
    if not store_of(request.app.state).delete(rid):
        return _not_found(rid)
    return JSONBody({"id": rid, "object": "response", "deleted": True})


async def input_items(request: Request) -> Response:
    rid = request.path_params["response_id"]
    stored = store_of(request.app.state).get(rid)
    if stored is None:
        return _not_found(rid)
    q = request.query_params
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        return _family().error_response(ErrorInfo(ErrorCode.INVALID_REQUEST, "limit must be 1 to 100", param="limit"))
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        return _family().error_response(ErrorInfo(ErrorCode.INVALID_REQUEST, "order must be 'asc' or 'desc'", param="order"))
    items = list(stored.input_items)
    if order == "desc":
        items.reverse()
    if after := q.get("after"):
        ids = [i.get("id") for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page, more = items[:limit], len(items) > limit
    return JSONBody({
        "object": "list", "data": page, "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None, "has_more": more,
    })  # fmt: skip


def routes() -> list[Route]:
    return [
        Route("/v1/responses", create, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", input_items, methods=["GET"]),
    ]
