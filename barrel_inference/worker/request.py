"""One generation request's state inside the scheduler."""

from __future__ import annotations

import enum
import time

from ..protocol import Accepted, CacheInfo, Delta, Done, ErrorInfo, FinishReason, TextPart, Timings, Usage, merge_parts
from .detok import IncrementalDetokenizer
from .stops import StopMatcher


class Phase(enum.Enum):
    WAITING = 0
    PREFILL = 1
    DECODE = 2
    DONE = 3
    TAIL = 4  # done (its Done is sent); its last sampled token joins one more batch, then its sequence is free


class Request:
    __slots__ = (
        "id", "peer", "prompt", "sampling", "grammar", "max_tokens", "session", "ignore_eos", "want_tokens",
        "phase", "seq", "sampler", "n_past", "n_cached", "last_token", "generated", "row",
        "detok", "stops", "pending_parts", "pending_tokens", "pending_n", "history", "hook", "tool_replay",
        "schema_receipt", "logprobs", "pending_logprobs",
        "t_submit", "t_start", "t_first", "t_end", "t_tail", "cache_kind", "cache_miss", "parked", "parked_on", "pin_ttl_s",
        "checkpoint_at",
    )  # fmt: skip

    def __init__(self, id: str, peer: bytes, prompt: list[int], *, sampling, grammar, max_tokens, session,
                 stop: list[str], ignore_eos: bool, want_tokens: bool, piece):
        self.id = id
        self.peer = peer
        self.prompt = prompt
        self.sampling = sampling
        self.grammar = grammar
        self.schema_receipt = None
        self.logprobs: int | None = None  # top alternatives per sampled token; None: no log-probabilities
        self.pending_logprobs: list = []
        self.max_tokens = max_tokens
        self.session = session
        self.ignore_eos = ignore_eos
        self.want_tokens = want_tokens
        self.phase = Phase.WAITING
        self.seq = -1
        self.sampler = None
        self.n_past = 0  # tokens of this request's sequence in the KV cache
        self.n_cached = 0  # prompt tokens found already in the KV cache (session reuse)
        self.last_token = -1
        self.generated = 0
        self.row = -1  # batch row whose logits belong to this request, this tick
        self.detok = IncrementalDetokenizer(piece)
        self.stops = StopMatcher(stop)
        self.pending_parts: list = []  # typed output parts since the last delta, in order
        self.pending_tokens: list[int] = []
        self.pending_n = 0
        self.history: list[int] = []  # generated tokens that are in the KV cache
        self.hook = None  # ToolHook: tool-call and thinking capture between sampling and detokenising
        self.tool_replay: dict[str, int] = {}  # replay-map lookups made for its prompt
        self.t_submit = time.perf_counter()
        self.t_start = 0.0
        self.t_first = 0.0
        self.t_end = 0.0
        self.t_tail = 0.0  # when it became a tail (its last token not yet in the cache)
        self.cache_kind = "cold"  # how the prompt's prefix was found: see worker/kvreuse.py
        self.cache_miss = ""  # why a known session reused less than its last turn committed
        self.parked = False  # has waited once for a saved state to load from disk
        self.parked_on = None  # the entry it waits for
        self.pin_ttl_s = 0.0  # its cache is kept this long before retention may drop it (Submit.pin_ttl_s)
        self.checkpoint_at = 0  # a prompt length at which its prefill saves a state for others (kvreuse.py)

    # ---- output -------------------------------------------------------------------------
    def emit(self, *parts) -> None:
        """Append output parts (TextPart, ThinkingPart, tool-call parts) for the next delta, in order."""
        merge_parts(self.pending_parts, list(parts))

    def emit_text(self, text: str) -> None:
        if text:
            merge_parts(self.pending_parts, [TextPart(text)])

    def accepted(self, n_ctx: int) -> Accepted:
        return Accepted(self.id, prompt_tokens=len(self.prompt), cached_tokens=self.n_cached, n_ctx=n_ctx,
                        tool_replay=self.tool_replay, schema_receipt=self.schema_receipt, cache=self.cache_kind,
                        cache_miss=self.cache_miss)  # fmt: skip

    def take_delta(self) -> Delta | None:
        if not self.pending_parts and not self.pending_n:
            return None
        d = Delta(self.id, self.pending_parts, self.pending_tokens if self.want_tokens else [], self.pending_n, self.pending_logprobs)
        self.pending_logprobs = []
        self.pending_parts = []
        self.pending_tokens = []
        self.pending_n = 0
        return d

    def done(self, reason: FinishReason, stop: str | None = None, error: ErrorInfo | None = None, *,
             retained: bool = False) -> Done:  # fmt: skip
        """retained: its sequence keeps what it holds after the request (its evaluated prompt tokens are
        then committed for the next request to reuse)."""
        now = time.perf_counter()
        self.t_end = now
        self.phase = Phase.DONE
        start = self.t_start or now
        first = self.t_first or now
        timings = Timings(
            queue_ms=(start - self.t_submit) * 1000.0,
            prefill_ms=(first - start) * 1000.0 if self.t_start else 0.0,
            decode_ms=(now - first) * 1000.0 if self.t_first else 0.0,
        )
        usage = Usage(len(self.prompt), self.generated, self.n_cached)
        evaluated = len(self.prompt) - self.n_cached
        cache = CacheInfo(self.cache_kind, self.cache_miss, evaluated, committed_tokens=evaluated if retained else 0)
        return Done(self.id, reason, stop, usage, timings, error, cache)
