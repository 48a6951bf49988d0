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
- relayout: with a buffer per sequence, a sequence whose window cells were relaid in place as a
  restore lays them out (engine.seq_relayout) and whose state is then restored into another
  sequence: do both give bit for bit the same logits at the engine's threads? Where the exact
  question fails and this one holds, the worker relays a sequence before continuing its whole
  cache (`relayout`, kvreuse.py), so a session continues alike whether its cache stayed or came
  back from a tier.
  Only a complete state is relaid: one that lacks cells would lose them in place as well.
  One KV buffer for all sequences places a restore among the others' cells: not asked there.
"""

from __future__ import annotations

import numpy as np

from .engine_api import EngineError


def state_selftest(engine) -> dict:
    """Save and restore a probe sequence and compare the next token's logits with the run that
    never left the cache. Returns {"exact_up_to": n or None (no limit), "complete_up_to": n or
    None, "relayout_up_to": n or None (absent where not asked), "relayout": whether the worker
    relays sequences, "probes": [...], "flash_attn": ...}.

    Run on an idle context (at load): it uses sequences 0 and 1 and clears them after.
    """
    window = engine.n_swa > 0
    # a restore into another sequence id, as the tiers do (one id only: into the same one)
    other = 1 if engine.n_seq_total > 1 else 0
    relaid = window and not engine.kv_unified
    lengths = [engine.n_swa, engine.n_swa + 64] if window else [min(256, engine.n_ctx // 2)]
    lengths = [n for n in lengths if 2 <= n < min(engine.n_ctx, engine.n_batch * 64) - 1]
    probes: list[dict] = []
    if not lengths:
        return _result(probes, engine, relaid)
    rng = np.random.default_rng(1234)
    toks = [int(t) for t in rng.integers(0, engine.n_vocab, lengths[-1] + 1)]
    toks = [t if not engine.is_eog(t) else (t + 1) % engine.n_vocab for t in toks]

    def next_logits(n: int, threads: int | None, seq: int = 0) -> np.ndarray:
        """Token n's logits at `threads` (None: the engine's own); the sequence is cut back to n after."""
        if threads is not None:
            engine.set_threads(threads)
        try:
            if engine.decode([toks[n]], [n], [seq], [True]) != 0:
                raise EngineError("decode_failed", "the KV self-test's decode failed")
            return engine.logits(0).copy()
        finally:
            if threads is not None:
                engine.set_threads(None)
            engine.seq_truncate(seq, n)

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
            relaid_ref = relaid_got = None
            if relaid and engine.seq_relayout(0):
                # the worker's way: relaid in place before it goes on, or saved and restored elsewhere
                relaid_ref = next_logits(n, None)
                relaid_state = engine.state_seq_save(0)
                if engine.state_seq_load(other, relaid_state):
                    relaid_got = next_logits(n, None, other)
                if other != 0:
                    engine.seq_clear(other)
            engine.seq_clear(0)
            ok = engine.state_seq_load(0, state)
            got = next_logits(n, None) if ok else None
            got_one = next_logits(n, 1) if ok and window else None
            exact = bool(ok and np.array_equal(got, ref))
            probe = {
                "tokens": n,
                "exact": exact,
                "complete": bool(ok and np.array_equal(got_one, ref_one)) if window else exact,
                "max_abs_diff": float(np.max(np.abs(got - ref))) if ok else float("inf"),
            }  # fmt: skip
            if relaid:  # and only for a complete state: relaying one that lacks cells would lose them in place too
                probe["relayout"] = probe["complete"] and relaid_got is not None and bool(np.array_equal(relaid_got, relaid_ref))
            probes.append(probe)
            if not ok:
                break
            n_done = n
    finally:
        engine.seq_clear(0)
        engine.seq_clear(other)
    return _result(probes, engine, relaid)


def _up_to(probes: list[dict], key: str) -> int | None:
    """The longest probe that passed before the first that failed (0: none did); None: all passed."""
    for i, p in enumerate(probes):
        if not p[key]:
            return max([q["tokens"] for q in probes[:i]], default=0)
    return None


def _result(probes: list[dict], engine, relaid: bool = False) -> dict:
    out = {"exact_up_to": _up_to(probes, "exact"), "complete_up_to": _up_to(probes, "complete"), "probes": probes,
           "flash_attn": engine.flash_attn, "relayout": False}  # fmt: skip
    if relaid and probes:
        out["relayout_up_to"] = _up_to(probes, "relayout")
        # worth its cost (a window-sized state copy per continued turn) only where it restores more
        out["relayout"] = _longer(out["relayout_up_to"], out["exact_up_to"]) != out["exact_up_to"]
    return out


def _longer(a: int | None, b: int | None) -> int | None:
    """The longer of two limits (None: no limit)."""
    return None if a is None or b is None else max(a, b)


def restore_limit(selftest: dict | None, policy: str) -> int | None:
    """The longest state the tiers restore under kv_restore = policy ("exact" / "complete"): None
    for any length, 0 for none. "exact": what restores bit for bit, relaid where the self-test
    found relaying worthwhile (the worker then relays: relays(selftest, policy)), else in place;
    "complete": what restores bit for bit in place or at one thread, nothing relaid. A self-test
    from an older worker has no "complete_up_to": the exact limit stands."""
    if policy not in RESTORE_POLICIES:
        raise ValueError(f"kv_restore must be one of {', '.join(RESTORE_POLICIES)}, not {policy!r}")
    if not selftest:
        return None
    if relays(selftest, policy):
        return selftest["relayout_up_to"]
    if policy == "complete" and "complete_up_to" in selftest:
        return _longer(selftest.get("exact_up_to"), selftest["complete_up_to"])
    return selftest.get("exact_up_to")


def relays(selftest: dict | None, policy: str) -> bool:
    """Does the worker relay sequences (kvreuse.py)? Under "exact", where the self-test found that
    it restores more; "complete" accepts restores that differ only in where cells lie, so the
    cost of relaying (a copy of the window per continued turn, and the cells a relaid cache can
    no longer be cut back to) buys it nothing."""
    return bool(selftest and selftest.get("relayout")) and policy == "exact"


RESTORE_POLICIES = ("exact", "complete")
