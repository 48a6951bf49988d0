"""Grammar checks in stages: the best candidates by logit first, the whole vocabulary only if needed.

A grammar's cost per token grows with the candidates it checks (for a 262k vocabulary and an enum
of a few hundred values, seconds). Exact: greedy needs one allowed candidate (the best allowed one
is the best overall), top-k sampling needs k (the k best allowed ones are the ones top-k keeps).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def best_allowed(cand: np.ndarray, need: int, check: Callable[[np.ndarray], object],
                 stages: Sequence[int]) -> np.ndarray | None:  # fmt: skip
    """The allowed candidates among the best `m` of `cand` (llama_token_data rows: id, logit, p),
    for the first stage size m that holds at least `need` of them, best first (ties by id, as
    llama.cpp's greedy); None when no stage does (check the whole vocabulary) or need is 0 (no
    top-k: every candidate counts). check(sub) runs the grammar over sub in place, setting the
    logits of what it rejects to -inf."""
    if need <= 0:
        return None
    n = len(cand)
    for m in stages:
        if m >= n or need > m:
            break
        best = np.argpartition(-cand["logit"], m)[:m]
        sub = cand[best]
        sub = sub[np.lexsort((sub["id"], -sub["logit"]))]
        check(sub)
        allowed = sub[np.isfinite(sub["logit"])]
        if len(allowed) >= need:
            return allowed
    return None
