"""Sliding-window arithmetic of llama.cpp's KV cache (Gemma 2/3 and the like). Pure.

llama.cpp masks a window cell for a sequence once that sequence's next position p has
p - pos >= n_swa, and from then on may overwrite it: a sequence of n tokens keeps, in its window
layers, positions n - n_swa + 1 .. n - 1 at least, exactly what its next token attends to. A cache
can therefore be continued at a length only while its window layers reach back that far (chunked
windows need less than that, so the test is conservative for them); swa_full keeps every position.
"""

from __future__ import annotations


def window_start(n_past: int, n_swa: int, swa_full: bool) -> int:
    """The oldest position the token at n_past attends to in every layer."""
    if n_swa <= 0 or swa_full:
        return 0
    return max(0, n_past - n_swa + 1)


def swa_headroom(n_ctx: int, n_swa: int, swa_full: bool, n_seq_idle: int, spare_ids: int, idle_cells: int | None = None) -> int:
    """Sequence ids to ask for only to widen the window layers' cache. llama.cpp sizes it one
    window per sequence id (plus a ubatch), and reuses a window cell only when one sequence holds
    it: the cells of a prefix copied into idle sequences (a system prompt, all its first prefill
    left there) stay while they all hold it. With idle sequences: room for such a prefix as long
    as one context, or as the idle caches may hold (`idle_cells`) if that is less; at most
    `spare_ids` (what the context's id limit leaves). Each id costs a window's cells in every
    window layer."""
    if n_swa <= 0 or swa_full or n_seq_idle <= 0:
        return 0
    room = n_ctx if idle_cells is None else min(n_ctx, max(0, idle_cells))
    return max(0, min(-(-room // n_swa), spare_ids))
