"""The load-time check that a saved KV sequence state restores exactly (see README, "Exactness").

Pure: it drives an engine through its methods (decode, state_seq_save / load, seq_clear, logits).
"""

from __future__ import annotations

import numpy as np

from .engine_api import EngineError


def state_selftest(engine) -> dict:
    """Save and restore a probe sequence and compare the next token's logits with the run that
    never left the cache. Returns {"exact_up_to": n or None (no limit), "probes": [...]}.

    Run on an idle context (at load): it uses sequence 0 and clears it after.
    """
    lengths = [engine.n_swa, engine.n_swa + 64] if engine.n_swa > 0 else [min(256, engine.n_ctx // 2)]
    lengths = [n for n in lengths if 2 <= n < min(engine.n_ctx, engine.n_batch * 64) - 1]
    probes, limit = [], None
    if not lengths:
        return {"exact_up_to": limit, "probes": probes, "flash_attn": engine.flash_attn}
    rng = np.random.default_rng(1234)
    toks = [int(t) for t in rng.integers(0, engine.n_vocab, lengths[-1] + 1)]
    toks = [t if not engine.is_eog(t) else (t + 1) % engine.n_vocab for t in toks]
    try:
        # one probe sequence grows through every length. At each: save its state, decode the
        # next token in place (the reference), then clear it, restore the state into the same,
        # now empty, cells and decode that token again. Where the cells lie changes llama.cpp's
        # float reductions like a different batch split does, so the test keeps the layout and
        # asks only whether the saved state holds everything the model attends to.
        n_done = 0
        for n in lengths:
            for start in range(n_done, n, engine.n_batch):
                part = toks[start : min(n, start + engine.n_batch)]
                if engine.decode(part, list(range(start, start + len(part))), [0] * len(part), [False] * len(part)) != 0:
                    raise EngineError("decode_failed", "the KV self-test's decode failed")
            state = engine.state_seq_save(0)
            if engine.decode([toks[n]], [n], [0], [True]) != 0:
                raise EngineError("decode_failed", "the KV self-test's decode failed")
            ref = engine.logits(0).copy()
            engine.seq_clear(0)
            ok = engine.state_seq_load(0, state) and engine.decode([toks[n]], [n], [0], [True]) == 0
            got = engine.logits(0) if ok else None
            exact = bool(ok and np.array_equal(got, ref))
            probes.append({"tokens": n, "exact": exact, "max_abs_diff": float(np.max(np.abs(got - ref))) if ok else float("inf")})
            if not exact and limit is None:
                limit = max([p["tokens"] for p in probes if p["exact"]], default=0)
            if not ok:
                break
            n_done = n + 1
    finally:
        engine.seq_clear(0)
    return {"exact_up_to": limit, "probes": probes, "flash_attn": engine.flash_attn}
