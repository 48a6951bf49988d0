"""GET /v1/models and /v1/models/{id} in the Anthropic shape (asked for with the `anthropic-version` header).

The list holds every registry name and every alias (an alias shows the model it maps to in its
display_name), with the cursor fields the SDK pages by: has_more, first_id, last_id; `limit`
(1..1000, default 20), `after_id`, `before_id` as the real API takes them.
"""

from __future__ import annotations

import datetime as dt
from typing import Iterable

from ..errors import invalid

DEFAULT_LIMIT = 20
MAX_LIMIT = 1000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def rfc3339(when: dt.datetime | float | int | None) -> str:
    if when is None:
        when = _EPOCH
    elif not isinstance(when, dt.datetime):
        when = dt.datetime.fromtimestamp(float(when), tz=dt.timezone.utc)
    elif when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def model_info(model_id: str, created: dt.datetime | float | None, target: str | None = None) -> dict:
    display = model_id if target is None or target == model_id else f"{model_id} (alias of {target})"
    return {"type": "model", "id": model_id, "display_name": display, "created_at": rfc3339(created)}


def page(items: list[dict], *, limit: str | None, after_id: str | None, before_id: str | None) -> dict:
    """One page of `items` (already in list order) by the real API's cursor rules."""
    if limit is None:
        n = DEFAULT_LIMIT
    else:
        try:
            n = int(limit)
        except ValueError:
            raise invalid(f"limit: must be an integer, got {limit!r}", "limit") from None
        if not 1 <= n <= MAX_LIMIT:
            raise invalid(f"limit: must be between 1 and {MAX_LIMIT}, got {n}", "limit")
    ids = [m["id"] for m in items]
    if after_id is not None and before_id is not None:
        raise invalid("pass after_id or before_id, not both", "after_id")
    if after_id is not None:
        start = ids.index(after_id) + 1 if after_id in ids else len(ids)
        chosen = items[start : start + n]
        has_more = start + n < len(items)
    elif before_id is not None:
        end = ids.index(before_id) if before_id in ids else 0
        chosen = items[max(0, end - n) : end]
        has_more = end - n > 0
    else:
        chosen = items[:n]
        has_more = n < len(items)
    return {
        "data": chosen,
        "has_more": has_more,
        "first_id": chosen[0]["id"] if chosen else None,
        "last_id": chosen[-1]["id"] if chosen else None,
    }


def list_of(records: Iterable[object], aliases: dict[str, str]) -> list[dict]:
    """Registry names (newest first, as the real API orders them), then aliases sorted by name."""
    recs = sorted(records, key=lambda r: rfc3339(getattr(r, "modified", None)), reverse=True)
    out = [model_info(r.name, getattr(r, "modified", None)) for r in recs]
    created = {r.name: getattr(r, "modified", None) for r in recs}
    names = {m["id"] for m in out}
    for alias in sorted(aliases):
        if alias not in names:
            target = aliases[alias]
            out.append(model_info(alias, created.get(target) or created.get(f"{target}:latest"), target))
    return out
