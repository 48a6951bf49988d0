"""The load-time check that a saved KV sequence state restores exactly (see README, "Exactness").

Pure: it drives an engine through its methods (decode, state_seq_save / load, seq_clear,
seq_truncate, set_threads, logits).

Two questions, asked at each probe length:
- exact: does the restored sequence give bit for bit the logits of the run that never left the
  cache, at the engine's threads? That is what kv_restore = "exact" (the default) restores.
- complete: does it at one thread? A saved state holds only the cells the next token attends to
  (llama.cpp leaves out the cells a sliding window has passed), so a restore puts them in other
  cells. llama.cpp's flash attention splits a one-token decode over 512 or more cells among the
  threads by cell index, and each thread sums its own share (in f16 on the CPU), so other cells
  give other partial sums. At one thread there is one share, summed in cell order, which a
  restore keeps. Equal there means the state holds everything the model attends to, and what
  is left is where the sums are split. That is what kv_restore = "complete" restores. Without a
  sliding window a state leaves no cell out, so the question is not asked there (complete is
  exact): a decode at one thread of a large model on a CPU takes seconds.
"""

from __future__ import annotations

import numpy as np

from .engine_api import EngineError


def state_selftest(engine) -> dict:
    """Save and restore a probe sequence and compare the next token's logits with the run that
    never left the cache. Returns {"exact_up_to": n or None (no limit), "complete_up_to": n or
    None, "probes": [...], "flash_attn": ...}.

    Run on an idle context (at load): it uses sequence 0 and clears it after.
    """
    window = engine.n_swa > 0
    lengths = [engine.n_swa, engine.n_swa + 64] if window else [min(256, engine.n_ctx // 2)]
    lengths = [n for n in lengths if 2 <= n < min(engine.n_ctx, engine.n_batch * 64) - 1]
    probes: list[dict] = []
    if not lengths:
        return _result(probes, engine)
    rng = np.random.default_rng(1234)
    toks = [int(t) for t in rng.integers(0, engine.n_vocab, lengths[-1] + 1)]
    toks = [t if not engine.is_eog(t) else (t + 1) % engine.n_vocab for t in toks]

    def next_logits(n: int, threads: int | None) -> np.ndarray:
        """Token n's logits at `threads` (None: the engine's own); the sequence is cut back to n after."""
        if threads is not None:
            engine.set_threads(threads)
        try:
            if engine.decode([toks[n]], [n], [0], [True]) != 0:
                raise EngineError("decode_failed", "the KV self-test's decode failed")
            return engine.logits(0).copy()
        finally:
            if threads is not None:
                engine.set_threads(None)
            engine.seq_truncate(0, n)

    try:
        # one probe sequence grows through every length. At each: save its state, take the next
        # token's logits in place (the references), then clear it, restore the state into the now
        # empty sequence and take them again. The sequence grows on from the restored cells.
        n_done = 0
        for n in lengths:
            for start in range(n_done, n, engine.n_batch):
                part = toks[start : min(n, start + engine.n_batch)]
                if engine.decode(part, list(range(start, start + len(part))), [0] * len(part), [False] * len(part)) != 0:
                    raise EngineError("decode_failed", "the KV self-test's decode failed")
            state = engine.state_seq_save(0)
            ref = next_logits(n, None)
            ref_one = next_logits(n, 1) if window else None
            engine.seq_clear(0)
            ok = engine.state_seq_load(0, state)
            got = next_logits(n, None) if ok else None
            got_one = next_logits(n, 1) if ok and window else None
            exact = bool(ok and np.array_equal(got, ref))
            probes.append({
                "tokens": n,
                "exact": exact,
                "complete": bool(ok and np.array_equal(got_one, ref_one)) if window else exact,
                "max_abs_diff": float(np.max(np.abs(got - ref))) if ok else float("inf"),
            })  # fmt: skip
            if not ok:
                break
            n_done = n
    finally:
        engine.seq_clear(0)
    return _result(probes, engine)


def _up_to(probes: list[dict], key: str) -> int | None:
    """The longest probe that passed before the first that failed (0: none did); None: all passed."""
    for i, p in enumerate(probes):
        if not p[key]:
            return max([q["tokens"] for q in probes[:i]], default=0)
    return None


def _result(probes: list[dict], engine) -> dict:
    return {"exact_up_to": _up_to(probes, "exact"), "complete_up_to": _up_to(probes, "complete"), "probes": probes,
            "flash_attn": engine.flash_attn}  # fmt: skip


def restore_limit(selftest: dict | None, policy: str) -> int | None:
    """The longest state the tiers restore under kv_restore = policy ("exact" / "complete"): None
    for any length, 0 for none. A self-test from an older worker has no "complete_up_to": the
    exact limit stands."""
    if policy not in RESTORE_POLICIES:
        raise ValueError(f"kv_restore must be one of {', '.join(RESTORE_POLICIES)}, not {policy!r}")
    if not selftest:
        return None
    if policy == "complete" and "complete_up_to" in selftest:
        return selftest["complete_up_to"]
    return selftest.get("exact_up_to")


RESTORE_POLICIES = ("exact", "complete")
