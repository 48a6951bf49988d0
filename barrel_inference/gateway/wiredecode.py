"""Decoding a request body into a family's wire Struct, with errors that name the offending field.

Every API family decodes with msgspec; what differs is only how it words the error, so each family's
wire module wraps `decode` with its own message.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import msgspec


class WireError(ValueError):
    """A body that is not valid JSON or does not fit the request Struct; `param` names the field."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`")


def param_of(message: str) -> tuple[str, str | None]:
    """msgspec's 'Expected `int`, got `str` - at `$.max_tokens`' -> ('Expected `int`, got `str`', 'max_tokens')."""
    path = None
    m = _PATH.search(message)
    if m:
        path = m.group("path").lstrip(".") or None
        message = message[: m.start()]
    missing = _MISSING.match(message)
    if missing:
        field = missing.group("field")
        path = f"{path}.{field}" if path else field
    return message, path


def decode(body: bytes, type_: type, word: Callable[[str, str | None], str]) -> Any:
    """`body` as `type_`; WireError with `word(message, param)` as its text when it does not fit."""
    if not body.strip():
        raise WireError("the request body is empty; send a JSON object", None)
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        message, param = param_of(str(exc))
        raise WireError(word(message, param), param) from None
    except msgspec.DecodeError as exc:
        raise WireError(f"the request body is not valid JSON: {exc}", None) from None
    except RecursionError:
        raise WireError("the request body is nested too deeply", None) from None
