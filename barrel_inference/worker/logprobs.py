"""A sampled token's log-probability and the most likely alternatives, from one row of logits."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..protocol import TokenLogprob, TopLogprob


def log_probability(row: np.ndarray, token: int, k: int, bias: dict[int, float] | None,
                    piece: Callable[[int], bytes]) -> TokenLogprob:  # fmt: skip
    """`token`'s log-probability under the logits `row` after the logit bias (row is not changed),
    and the k most likely tokens there, best first (ties by id); piece(t) gives a token's bytes."""
    logits = np.array(row, np.float32)
    n_vocab = len(logits)
    for t, b in (bias or {}).items():
        if 0 <= t < n_vocab:
            logits[t] += b
    m = float(logits.max())
    logz = m + float(np.log(np.exp(logits - m).sum(dtype=np.float64)))
    top: list[TopLogprob] = []
    if k > 0:
        best = np.argpartition(-logits, k)[:k] if k < n_vocab else np.arange(n_vocab)
        best = best[np.lexsort((best, -logits[best]))]
        top = [TopLogprob(int(t), float(logits[t] - logz), piece(int(t))) for t in best]
    return TokenLogprob(token, float(logits[token] - logz), piece(token), top)
