"""The `anthropic_api_keys` allowlist: `x-api-key` or `Authorization: Bearer`, compared in constant time.

An empty list means open (any key, or none, is accepted), which is what a local daemon wants by default.
"""

from __future__ import annotations

import hmac
from typing import Mapping, Sequence


def presented_key(headers: Mapping[str, str]) -> str | None:
    key = headers.get("x-api-key")
    if key:
        return key
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def key_allowed(key: str | None, allowed: Sequence[str]) -> bool:
    """True when the list is empty or `key` equals one of its keys; every key is compared, in constant time."""
    if not allowed:
        return True
    if key is None:
        return False
    given = key.encode()
    ok = False
    for candidate in allowed:
        ok |= hmac.compare_digest(given, candidate.encode())
    return ok
