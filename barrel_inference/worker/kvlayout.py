"""Which KV layout a model gets: one buffer for all sequences, or a buffer per sequence id.

`kv_unified = "auto"` (the default) takes a buffer per sequence where that costs little memory:
it is the faster layout for agents and many conversations (no cache widens another sequence's
attention, and prefill does not slow as cells are used and freed), but it holds n_ctx cells for
every sequence id, running and idle, where one buffer holds n_ctx per running sequence plus
max_retained_tokens (README, "Which layout"). Pure: the engine hands in the model's figures.
"""

from __future__ import annotations

# "auto" takes a buffer per sequence while its KV cache stays within this many bytes
AUTO_SPLIT_MAX_BYTES = 2 << 30


def bytes_per_cell(n_layer: int, n_head_kv: int, head_k: int, head_v: int, value_bytes: int = 2) -> int:
    """KV bytes one cell takes over all layers (f16 K and V; an upper bound on sliding-window
    models, whose window layers hold fewer cells)."""
    return max(0, n_layer) * max(0, n_head_kv) * (max(0, head_k) + max(0, head_v)) * value_bytes


def choose(setting, *, split_bytes: int, limit: int | None = None) -> tuple[bool, str]:
    """(unified, why) for a kv_unified setting: True / False as set; "auto": a buffer per sequence
    when its cache (split_bytes) is at most `limit` (AUTO_SPLIT_MAX_BYTES), else one buffer."""
    limit = AUTO_SPLIT_MAX_BYTES if limit is None else limit
    if setting is True or setting is False:
        return setting, "set"
    if setting != "auto":  # (1 and 0 are not settings either, though they compare equal to bools)
        raise ValueError(f"kv_unified must be true, false or \"auto\", not {setting!r}")
    gib = split_bytes / (1 << 30)
    if split_bytes <= limit:
        return False, f"auto: a buffer per sequence takes {gib:.2f} GiB of KV, within {limit / (1 << 30):.0f} GiB"
    return True, f"auto: a buffer per sequence would take {gib:.2f} GiB of KV, over {limit / (1 << 30):.0f} GiB"
