"""Structured output, the gateway's half (every family): the receipt header, and the finished text
validated against the request's JSON schema.

The worker turns the schema into a grammar and says which keywords that grammar enforces, which must
be checked after generation and which neither (protocol.SchemaReceipt). A text that ends normally
(stop) and does not validate becomes an error (output_invalid), never a success; a text cut by the
token limit keeps finish_reason "length".
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ..protocol import Done, ErrorCode, ErrorInfo, FinishReason, SchemaReceipt

HEADER = "x-structured-output"


def receipt_header(receipt: SchemaReceipt | None) -> dict[str, str]:
    """`x-structured-output: enforced=a,b; checked=c; unenforced=d` (empty lists as "-")."""
    if receipt is None:
        return {}
    parts = [f"{name}={','.join(getattr(receipt, name)) or '-'}" for name in ("enforced", "checked", "unenforced")]
    return {HEADER: "; ".join(parts)}


def effective_schema(schema: dict) -> dict:
    return {"type": "object"} if schema == {} else schema


def validation_error(text: str, schema: dict) -> str | None:
    """Why `text` is not a JSON document valid for `schema`, or None."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"the output is not JSON: {exc}"
    schema = effective_schema(schema)
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        err = jsonschema.exceptions.best_match(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value))
    except Exception as exc:  # noqa: BLE001 - an unresolvable $ref, a bad pattern: not valid either
        return f"the schema cannot be applied to the output: {exc}"
    if err is None:
        return None
    where = "/".join(str(p) for p in err.absolute_path) or "(root)"
    return f"the output does not match the schema at {where}: {err.message}"


async def checked_done(done: Done, text: str, schema: dict | None) -> Done:
    """`done`, or an output_invalid error in its place when a finished structured text is invalid."""
    if schema is None or done.error is not None or done.finish_reason != FinishReason.STOP:
        return done
    why = await asyncio.to_thread(validation_error, text, schema)
    if why is None:
        return done
    return Done(done.id, FinishReason.ERROR, usage=done.usage, timings=done.timings,
                error=ErrorInfo(ErrorCode.OUTPUT_INVALID, f"structured output failed validation: {why}"))  # fmt: skip


def schema_of(submit: Any) -> dict | None:
    return getattr(submit, "json_schema", None)
