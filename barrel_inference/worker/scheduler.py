"""Continuous batching: the scheduler loop, on its own thread.

Each tick builds ONE batch: the next token of every decoding sequence, then a chunk of each
prefilling prompt (at most `prefill_chunk` tokens each, within n_batch; with one KV buffer the
first chunk fills the batch to a multiple of `prefill_chunk` rows, see first_chunk), decodes it once and
samples every sequence whose logits came out. A request that arrives while others stream joins
the next tick; an abort frees its sequence at the start of the next tick. Which sequence a new
request gets, and what of its prompt is already in the KV cache, is kvreuse.py's business; a
request whose best prefix is on disk waits in `parked` until the store has read it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Callable

from ..protocol import Done, ErrorCode, ErrorInfo, FinishReason, Tick
from .engine_api import Engine, EngineError
from .profile import TickProfile
from .request import Phase, Request
from .kvreuse import KvReuse

Emit = Callable[[bytes, Tick], None]


def first_chunk(prefill_chunk: int, n_decode: int, unified: bool) -> int:
    """Scheduler.first_chunk's rule: with one KV buffer the decode rows count against the chunk,
    unless that leaves the prompt less than half of it; with a buffer per sequence a whole chunk."""
    if not unified:
        return prefill_chunk
    aligned = prefill_chunk - n_decode % prefill_chunk
    return aligned if 2 * aligned >= prefill_chunk else prefill_chunk


class Scheduler:
    def __init__(self, engine: Engine, emit: Emit, *, n_ctx: int, prefill_chunk: int = 512, log=None,
                 reuse: KvReuse | None = None, tail_grace_s: float = 0.0):  # fmt: skip
        self.engine = engine
        self.emit = emit
        self.n_ctx = n_ctx  # per-sequence limit: prompt + generated tokens
        self.prefill_chunk = max(1, prefill_chunk)
        self.n_batch = engine.n_batch
        self.log = log or (lambda *a, **k: None)
        self.reuse = reuse or KvReuse(engine, n_seq=engine.n_seq_total, max_busy=engine.n_seq_max, log=self.log)
        self.pool = self.reuse.pool
        self.parked: list[Request] = []  # waiting for a saved state to be read from disk
        self.profile = TickProfile()
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []  # admission order
        self._inbox: deque = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.n_requests = 0
        self.n_aborts = 0  # requests ended by an abort from a gateway (client gone, cancelled)
        self.n_decode_failures = 0
        self.waker: Callable[[], None] | None = None  # wakes the thread's I/O poll when another thread posts
        # A finished request's last sampled token goes into its sequence's cache in a batch of its
        # own (the next turn then reuses prompt + completion). With a grace, a lone tail waits that
        # long for other work to ride along with; a next turn of the same conversation arriving
        # meanwhile takes the token in its own first prompt batch instead (it is the first token of
        # its prompt past the cache), so a client that sends its next turn at once does not wait
        # for a decode of its own: that turn reuses one token less (the count says so). With a KV
        # buffer per sequence it rides only in batches without prompt rows (_hold_tails).
        self.tail_grace_s = max(0.0, tail_grace_s)
        self.n_tails_folded = 0

    # ---- called from other threads ------------------------------------------------------
    def submit(self, req: Request) -> None:
        self._post(("submit", req))

    def abort(self, ids: list[str]) -> None:
        self._post(("abort", ids))

    def end_session(self, session: str) -> None:
        self._post(("end_session", session))

    def entry_loaded(self, entry, ok: bool) -> None:
        """A saved state finished loading from disk (called on the store's I/O thread)."""
        self._post(("loaded", entry))

    def _post(self, item) -> None:
        with self._cond:
            self._inbox.append(item)
            self._cond.notify()
        if self.waker is not None:
            self.waker()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="scheduler", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def n_running(self) -> int:
        return sum(1 for r in self.active if r.phase is not Phase.TAIL)

    @property
    def n_waiting(self) -> int:
        return len(self.waiting) + len(self.parked)

    # ---- the loop -----------------------------------------------------------------------
    def _tail_wait(self) -> float | None:
        """Seconds until the first deferred tail is due, when deferred tails are all there is to do."""
        if self.waiting or not self.active or any(r.phase is not Phase.TAIL for r in self.active):
            return None
        return max(0.0, min(r.t_tail for r in self.active) + self.tail_grace_s - time.perf_counter())

    def run(self, pump: Callable[[bool | float], None] | None = None) -> None:
        """The loop. `pump(block)`, when given, is this thread's I/O: called before every tick, it
        reads the link and posts what arrived (blocking a while when there is no work, or up to
        `block` seconds when it is a number: a deferred tail is due then)."""
        while True:
            wait = self._tail_wait() if self.tail_grace_s > 0 else None
            if pump is not None:
                pump(wait if wait is not None and not self._inbox else (not self._inbox and not self.active and not self.waiting))
            with self._cond:
                while pump is None and not self._inbox and not self._stop and not self.active and not self.waiting:
                    self._cond.wait()
                if pump is None and wait and not self._inbox and not self._stop:
                    self._cond.wait(wait)
                if self._stop:
                    break
                items = list(self._inbox)
                self._inbox.clear()
            out: dict[bytes, Tick] = {}
            self.pool.tick += 1  # a sequence released in this round is safe from this round's retention
            try:
                self._apply(items, out)
                self._admit(out)
                if self.active:
                    self._tick(out)
            except Exception as exc:  # a bug must not kill the loop: fail what is in flight, go on
                self._crashed(exc, out)
            self._send(out)
        self._shutdown()

    def _apply(self, items, out) -> None:
        for kind, arg in items:
            if kind == "submit":
                self.waiting.append(arg)
                self.n_requests += 1
            elif kind == "abort":
                ids = set(arg)
                for r in [r for r in self.waiting if r.id in ids]:
                    self.waiting.remove(r)
                    self.n_aborts += 1
                    self._finish(r, out, FinishReason.ABORT)
                for r in [r for r in self.parked if r.id in ids]:
                    self.parked.remove(r)
                    self.n_aborts += 1
                    self._finish(r, out, FinishReason.ABORT)
                # a request already ended (its Done sent, perhaps still in its tail tick) is not ended again
                for r in [r for r in self.active if r.id in ids and r.phase not in (Phase.DONE, Phase.TAIL)]:
                    self.n_aborts += 1
                    self._finish(r, out, FinishReason.ABORT)
            elif kind == "end_session":
                self.reuse.end_session(arg)
            elif kind == "loaded":  # parked requests go back to the front of the queue
                back = [r for r in self.parked if r.parked_on is arg]
                self.parked = [r for r in self.parked if r.parked_on is not arg]
                for r in reversed(back):
                    r.parked_on = None
                    self.waiting.appendleft(r)
        self.active = [r for r in self.active if r.phase is not Phase.DONE]

    def _admit(self, out) -> None:
        live = None
        tails = [r for r in self.active if r.phase is Phase.TAIL]
        i = 0
        while i < len(self.waiting):
            req = self.waiting[i]
            if tails and any(_continues(req, t) for t in tails):
                if self.tail_grace_s <= 0:
                    return  # the previous turn's last token enters the cache this tick: admit after it
                for t in [t for t in tails if _continues(req, t)]:  # its prompt takes the token (see __init__)
                    self._fold_tail(t)
                    tails.remove(t)
            if live is None:  # what busy sequences have committed: their prefixes can be copied
                live = {r.seq: (r.prompt, min(r.n_past, len(r.prompt))) for r in self.active if r.seq >= 0}
            try:
                got = self.reuse.admit(req, live)
            except Exception as exc:  # a bug in reuse fails this request, never the queue behind it
                del self.waiting[i]
                self.log("admit_error", id=req.id, error=repr(exc))
                self.reuse.unadmit(req)
                self._finish(req, out, FinishReason.ERROR, error=ErrorInfo(ErrorCode.INTERNAL, f"internal error admitting the request: {exc!r}", retryable=True))
                continue
            if got is False:  # no sequence free: keep the order
                return
            del self.waiting[i]
            if got is None:  # its prefix is being read from disk (req.parked_on)
                self.parked.append(req)
                continue
            try:
                if req.sampler is None:  # the worker's server builds it off this thread; in-process users may not
                    req.sampler = self.engine.make_sampler(req.sampling, req.grammar)
            except Exception as exc:  # this request's sampler only: the others go on
                self.reuse.unadmit(req)
                code = ErrorCode(exc.code) if isinstance(exc, EngineError) else ErrorCode.INTERNAL
                self._finish(req, out, FinishReason.ERROR, error=ErrorInfo(code, f"cannot build the sampler: {exc}"))
                continue
            self.active.append(req)  # from here on a crash fails it with the others, never loses it
            live[req.seq] = (req.prompt, req.n_past)
            req.phase = Phase.PREFILL
            req.t_start = time.perf_counter()
            out.setdefault(req.peer, Tick()).accepted.append(req.accepted(self.n_ctx))

    def _fold_tail(self, t: Request) -> None:
        """Release a tail's sequence without its last token, which the next turn's prompt holds."""
        self.reuse.release(t, (t.prompt + t.history)[: t.n_past])
        t.seq = -1
        t.phase = Phase.DONE
        self.active.remove(t)
        self.n_tails_folded += 1

    def _tick(self, out) -> None:
        prof = self.profile
        t0 = time.perf_counter()
        tokens: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        logits: list[bool] = []
        if self.tail_grace_s > 0 and (self._tail_wait() or 0.0) > 0:
            return  # lone tails wait for their grace (or for work to ride along with)
        hold = self._hold_tails()
        tails: list[Request] = []
        for r in self.active:
            r.row = -1
            if r.phase is Phase.TAIL and hold:
                continue
            if r.phase is Phase.DECODE or r.phase is Phase.TAIL:
                if r.phase is Phase.DECODE:
                    r.row = len(tokens)
                else:
                    tails.append(r)
                tokens.append(r.last_token)
                pos.append(r.n_past)
                seqs.append(r.seq)
                logits.append(r.phase is Phase.DECODE)
        n_decode = len(tokens)
        budget = self.n_batch - n_decode
        chunks: list[tuple[Request, int]] = []
        even = None if self.engine.kv_unified else self.even_chunk(budget)
        for r in self.active:
            if r.phase is not Phase.PREFILL or budget <= 0:
                continue
            chunk = even or (self.prefill_chunk if chunks else self.first_chunk(n_decode))
            take = min(chunk, budget, len(r.prompt) - r.n_past)
            if r.n_past < r.checkpoint_at < r.n_past + take:  # the chunk ends where a checkpoint is saved
                take = r.checkpoint_at - r.n_past
            start = r.n_past
            for i in range(take):
                tokens.append(r.prompt[start + i])
                pos.append(start + i)
                seqs.append(r.seq)
                logits.append(False)
            if start + take == len(r.prompt):
                logits[-1] = True
                r.row = len(tokens) - 1
            chunks.append((r, take))
            budget -= take
        if not self.engine.kv_unified:
            tokens, pos, seqs, logits = self._in_sequence_order(tokens, pos, seqs, logits)
        t1 = time.perf_counter()
        status = self.engine.decode(tokens, pos, seqs, logits)
        while status == 1 and self.reuse.drop_idle():  # no KV slot: idle caches give way, oldest first
            status = self.engine.decode(tokens, pos, seqs, logits)
        t2 = time.perf_counter()
        if status != 0:
            self._decode_failed(status, out)
            return
        for r in self.active:
            if r.phase is Phase.DECODE:
                r.n_past += 1
                r.history.append(r.last_token)
        for r in tails:  # its sequence now holds everything it generated
            r.n_past += 1
            r.history.append(r.last_token)
            self.reuse.release(r, (r.prompt + r.history)[: r.n_past])
            r.seq = -1
            r.phase = Phase.DONE
        for r, take in chunks:
            r.n_past += take
            if r.n_past == r.checkpoint_at:
                self.reuse.checkpoint(r)  # (where that lost its cache, the prompt starts over)
        sampled: list[tuple[Request, int]] = []
        for r in self.active:
            if r.row >= 0:
                if r.hook is not None and r.hook.forced:  # the hook's tokens instead of a sample
                    tok = r.hook.forced.popleft()
                    self.engine.accept(r.sampler, tok)
                else:
                    tok = self.engine.sample(r.sampler, r.row)
                    if r.logprobs is not None and not self.engine.is_eog(tok):
                        r.pending_logprobs.append(self.engine.token_logprob(r.row, tok, r.logprobs, r.sampling.logit_bias))
                sampled.append((r, tok))
        t3 = time.perf_counter()
        for r, tok in sampled:
            self._on_token(r, tok, out)
        self.active = [r for r in self.active if r.phase is not Phase.DONE]
        t4 = time.perf_counter()
        prof.add(build=t1 - t0, decode=t2 - t1, sample=t3 - t2, detok=t4 - t3,
                 n_tokens=len(tokens), n_decode=n_decode, n_prefill=len(tokens) - n_decode)  # fmt: skip

    def _hold_tails(self) -> bool:
        """Do deferred tails stay out of this tick? With a KV buffer per sequence llama.cpp decodes a
        tail's one row in a pass apart from a prompt's rows, so a tail riding in a prompt's batch
        delays that prompt's first token by a pass of its own (on Gemma 3 270M, 2 cores: 17 prompt
        rows took 54 ms, 65 ms with another sequence's tail). So where tails wait anyway (a grace),
        they wait out ticks that prefill, and go with running streams' rows or on their own once
        nothing else is left; a next turn of the same conversation still takes its tail (_admit)."""
        if self.tail_grace_s <= 0 or self.engine.kv_unified:
            return False
        return any(r.phase is Phase.PREFILL for r in self.active)

    def first_chunk(self, n_decode: int) -> int:
        """Prompt rows for the first prefilling request of a tick with n_decode decode rows.

        llama.cpp's CPU kernels work in row tiles: on a 2-core Xeon a batch of 256 rows took 459 ms
        and one of 260 rows 527-617 ms (BENCHMARKS.md, "Batch rows"). With one KV buffer the whole
        batch is one ubatch, so the decode rows count against the chunk and the batch holds a whole
        multiple of prefill_chunk rows; where that would leave the prompt less than half a chunk
        (more decode rows than half a chunk), it takes a whole chunk. With a buffer per sequence
        llama.cpp decodes the prompt's rows apart from the decode rows (one token per sequence):
        the prompt takes a whole chunk (measured: 2,000 tokens beside 4 streams in 3.53 s at 256 a
        tick, 3.68-3.75 s at 252)."""
        return first_chunk(self.prefill_chunk, n_decode, self.engine.kv_unified)

    def even_chunk(self, budget: int) -> int | None:
        """With a KV buffer per sequence: the prompt rows each prefilling request takes this tick,
        the same for all of them (None: fewer than two prefill, or what they have left of this
        tick's chunk differs more than twofold: the longer ones would wait ticks, each as long as
        every stream's decode, for passes that cost less). llama.cpp splits such a batch
        into passes of equally many rows per sequence over consecutive sequence ids, so prompts
        of unequal lengths in one batch cost a pass per distinct remainder; equal chunks cost one.
        Measured on Gemma 3 270M (2 cores): 7 prompts of 20-23 tokens beside one stream took 331
        ms in one batch; with equal chunks, 4 prompts of 19 beside 4 streams took 149 ms."""
        rest = [min(self.prefill_chunk, len(r.prompt) - r.n_past) for r in self.active if r.phase is Phase.PREFILL]
        if len(rest) < 2 or max(rest) > 2 * min(rest):
            return None  # so unlike that the longer ones would wait ticks for the shortest: each its own
        return max(1, min(budget // len(rest), min(rest)))

    def _in_sequence_order(self, tokens, pos, seqs, logits):
        """The batch's rows sorted by sequence id (each sequence's rows keep their order), with
        every request's row moved along: with a KV buffer per sequence llama.cpp takes a run of
        consecutive ids in one pass, and ids in admission order break runs. Sequences with one row
        (decode) and with several (prompt chunks) form two groups, ordered so that no run joins
        them: a run that did would hold one row of each, and leave the prompt's rows an odd pass
        (255 rows instead of 256 beside four streams)."""
        counts = Counter(seqs)
        one = [q for q, n in counts.items() if n == 1]
        many = [q for q, n in counts.items() if n > 1]
        prompts_first = bool(one and many) and max(one) + 1 == min(many)  # decode rows first would join them
        order = sorted(range(len(tokens)), key=lambda i: ((counts[seqs[i]] > 1) != prompts_first, seqs[i]))
        moved = [0] * len(order)
        for new, old in enumerate(order):
            moved[old] = new
        for r in self.active:
            if r.row >= 0:
                r.row = moved[r.row]
        return [tokens[i] for i in order], [pos[i] for i in order], [seqs[i] for i in order], [logits[i] for i in order]

    def _on_token(self, r: Request, tok: int, out) -> None:
        if r.phase is Phase.PREFILL:
            r.phase = Phase.DECODE
            r.t_first = time.perf_counter()
        r.generated += 1
        r.last_token = tok  # sampled, not yet in the KV cache
        if not r.ignore_eos and self.engine.is_eog(tok):
            self._finish(r, out, FinishReason.STOP)
            return
        r.pending_n += 1
        if r.want_tokens:
            r.pending_tokens.append(tok)
        if r.hook is not None:  # tool calls and thinking: typed parts instead of plain text
            end, stop = r.hook.token(r, tok, self.engine)
            if end is not None and stop is None:
                self._finish(r, out, end)
                return
        else:
            text, stop = r.stops.push(r.detok.feed(tok))
            r.emit_text(text)
        if stop is not None:
            self._finish(r, out, FinishReason.STOP, stop=stop)
        elif r.max_tokens is not None and r.generated >= r.max_tokens:
            self._finish(r, out, FinishReason.LENGTH)
        elif r.n_past + 1 >= self.n_ctx:
            self._finish(r, out, FinishReason.LENGTH)
        else:
            r.last_token = tok

    # ---- endings ------------------------------------------------------------------------
    def _finish(self, r: Request, out, reason: FinishReason, stop: str | None = None, error: ErrorInfo | None = None):
        if r.hook is not None and error is None and reason is not FinishReason.ABORT:
            reason = r.hook.finish(r, FinishReason.STOP if reason is FinishReason.TOOL_CALLS else reason, eog=True)
            if r.hook.error is not None:
                reason, error = FinishReason.ERROR, ErrorInfo(ErrorCode.TOOL_CALL_INVALID, r.hook.error)
        if reason in (FinishReason.STOP, FinishReason.LENGTH) and stop is None:
            tail = r.stops.flush() + r.detok.flush()
            r.emit_text(tail)
        tick = out.setdefault(r.peer, Tick())
        if reason is not FinishReason.ABORT and reason is not FinishReason.ERROR:
            d = r.take_delta()
            if d is not None:
                tick.deltas.append(d)
        # the last sampled token goes into the cache with the next batch (the next turn's prompt holds
        # it): such a sequence is released after that; any other is released now, kept unless it failed
        tail = r.seq >= 0 and reason in (FinishReason.STOP, FinishReason.LENGTH) and r.generated and r.n_past + 1 < self.n_ctx
        retained = tail or (r.seq >= 0 and reason is not FinishReason.ERROR)
        # a released sequence is never dropped by the retention of the tick that releases it (seqpool),
        # so what `retained` promises holds when the Done goes out
        done = r.done(reason, stop, error, retained=retained)
        tick.done.append(done)
        if r.sampler is not None:
            r.sampler.free()
            r.sampler = None
        if tail:
            r.phase = Phase.TAIL
            r.t_tail = time.perf_counter()
            self.pool.finishing(r.seq)  # no longer a running neighbour for where newcomers go
        elif r.seq >= 0:
            keep = (r.prompt + r.history)[: r.n_past] if reason is not FinishReason.ERROR else None
            self.reuse.release(r, keep)
            r.seq = -1
        if done.cache is not None:
            c = done.cache
            c.ram_bytes, c.ram_entries, c.disk_bytes, c.disk_entries = self.reuse.tier_figures()
            c.evictions = self.reuse.evictions
        self.log("request_done", id=r.id, reason=reason.value, prompt=len(r.prompt), generated=r.generated)

    def _decode_failed(self, status: int, out) -> None:
        """llama_decode failed: fail only the requests in flight, recreate the context."""
        self.n_decode_failures += 1
        self.log("decode_failed", status=status, in_flight=len(self.active))
        err = ErrorInfo(ErrorCode.DECODE_FAILED, f"llama_decode failed with status {status}; the context was recreated", retryable=True)
        for r in self.active:
            r.seq = -1  # the whole context goes: nothing to release per sequence
            if r.phase is not Phase.TAIL:  # a tail's request is answered already
                self._finish(r, out, FinishReason.ERROR, error=err)
        self.active = []
        self.reuse.reset()
        self.engine.recreate_context()

    def _crashed(self, exc: Exception, out) -> None:
        self.log("scheduler_error", error=repr(exc), in_flight=len(self.active))
        err = ErrorInfo(ErrorCode.INTERNAL, f"internal error in the worker: {exc!r}", retryable=True)
        for r in self.active:
            if r.phase is not Phase.DONE:
                tail, r.seq = r.phase is Phase.TAIL, -1
                if not tail:
                    self._finish(r, out, FinishReason.ERROR, error=err)
        self.active = []
        self.reuse.reset()
        self.engine.recreate_context()

    def _send(self, out: dict[bytes, Tick]) -> None:
        t0 = time.perf_counter()
        for r in self.active:
            d = r.take_delta()
            if d is not None:
                out.setdefault(r.peer, Tick()).deltas.append(d)
        for peer, tick in out.items():
            self.emit(peer, tick)
        self.profile.add_send(time.perf_counter() - t0)

    def _shutdown(self) -> None:
        out: dict[bytes, Tick] = {}
        for r in list(self.waiting) + self.parked + self.active:
            if r.phase is Phase.TAIL:
                self.reuse.release(r, (r.prompt + r.history)[: r.n_past])
                r.seq = -1
            else:
                self._finish(r, out, FinishReason.ABORT)
        self.waiting.clear()
        self.parked = []
        self.active = []
        self._send(out)
        try:
            self.reuse.persist()
        except Exception as exc:  # saving caches at exit is a bonus, never a reason to hang
            self.log("kv_persist_failed", error=repr(exc))

    def stats(self) -> dict:
        tails = sum(1 for r in self.active if r.phase is Phase.TAIL)  # answered, last token not in the cache yet
        return {
            "running": self.n_running,
            "waiting": self.n_waiting,
            "n_seq_max": self.pool.max_busy,
            "n_seq_idle": len(self.pool) - self.pool.max_busy,  # sequence ids that only hold idle caches
            "kv_unified": self.engine.kv_unified,  # one KV buffer, or one per sequence
            "kv_layout": self.engine.kv_layout,  # why (kvlayout.py)
            # a tail's request is answered: its sequence only waits to take the last token in
            "seqs_busy": self.pool.n_busy - tails,
            # KV cells in use: the running requests' committed tokens plus what idle sequences retain
            "kv_cells_used": sum(r.n_past for r in self.active) + self.pool.retained(),
            "requests_total": self.n_requests,
            "aborts_total": self.n_aborts,
            "tails_folded": self.n_tails_folded,  # last tokens a next turn took into its own prompt batch
            "tails_pending": tails,
            "decode_failures": self.n_decode_failures,
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "prefill_chunk": self.prefill_chunk,
            "parked": len(self.parked),
            "cache": self.reuse.stats(),
            "profile": self.profile.as_dict(),
        }


def _continues(req: Request, tail: Request) -> bool:
    """Is req the next turn of tail's conversation (same session, or a prompt extending tail's)?"""
    if req.session is not None and req.session == tail.session:
        return True
    n = len(tail.prompt)
    return len(req.prompt) > n and req.prompt[:n] == tail.prompt


def error_done(req_id: str, code: ErrorCode, message: str, param: str | None = None) -> Done:
    return Done(req_id, FinishReason.ERROR, error=ErrorInfo(code, message, param=param))
