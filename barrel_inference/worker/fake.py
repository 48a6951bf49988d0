"""A fake engine with the scheduler's engine interface: no model, tokens as fast as asked.

Byte-level "vocabulary" (token = byte, plus EOS 256). The "model" continues a fixed text cyclically:
reading a sequence's tokens in order, it tracks how far the tail follows the text (a token that is
the text's next byte advances the match, any other restarts it), and predicts the next byte of the
text. A prompt that does not end inside the text therefore gets the text from its start.

Like llama.cpp it keeps per-sequence KV state: decode checks that each sequence's positions continue
its cache, and `sample(sampler, idx)` reads the prediction of batch row `idx` (a row decoded without
logits, or out of range, is an error), so a scheduler that maps a request to the wrong row gets the
wrong sequence's token. Used by gateway tests and by the gateway-overhead benchmark.
"""

from __future__ import annotations

import time

from ..protocol import Sampling
from .engine_api import EngineError

TEXT = "the quick brown fox jumps over the lazy dog "
EOS = 256


class FakeSampler:
    __slots__ = ()

    def free(self) -> None:
        pass


class FakeEngine:
    architecture = "fake"
    chat_template = None
    add_bos = False
    n_swa = 0
    n_seq_idle = 0
    kv_unified = True
    kv_layout = "set"

    def __init__(self, *, n_ctx: int = 4096, n_seq_max: int = 4, n_batch: int = 512, tps: float = 0.0, embed_seconds: float = 0.0,
                 n_seq_idle: int = 0, **_):  # fmt: skip
        self.n_ctx = n_ctx
        self.n_ctx_train = n_ctx
        self.n_seq_max = n_seq_max
        self.n_seq_idle = n_seq_idle
        self.n_batch = n_batch
        self.n_vocab = 257
        self.tick_seconds = 1.0 / tps if tps > 0 else 0.0
        self._text = TEXT.encode()
        self.embed_seconds = embed_seconds  # time each embedding input takes
        self.max_token_chars = 1
        # per sequence: match[i] = how far kv[:i] follows the text (len(kv) + 1 entries)
        self._match: list[list[int]] = [[0] for _ in range(self.n_seq_total)]
        self._rows: list[int | None] = []  # per row of the last batch: the predicted token, None without logits

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def piece(self, token: int, special: bool = False) -> bytes:
        return bytes([token]) if 0 <= token < 256 else b""

    def detokenize(self, tokens: list[int], special: bool = False) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def token_text(self, token: int) -> str:
        return "</s>" if token == EOS else self.piece(token).decode("latin-1")

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def _advance(self, m: int, tok: int) -> int:
        text = self._text
        if tok == text[m % len(text)]:
            return m + 1
        return 1 if tok == text[0] else 0

    def decode(self, tokens, pos, seqs, logits) -> int:
        """Like llama_decode: -1 (nothing changes) unless every sequence's positions continue its cache."""
        nxt: dict[int, int] = {}
        for p, q in zip(pos, seqs):
            if not 0 <= q < self.n_seq_total or p != nxt.get(q, len(self._match[q]) - 1):
                return -1
            nxt[q] = p + 1
        if self.tick_seconds:
            time.sleep(self.tick_seconds)
        rows: list[int | None] = []
        for tok, q, want in zip(tokens, seqs, logits):
            m = self._advance(self._match[q][-1], tok)
            self._match[q].append(m)
            rows.append(self._text[m % len(self._text)] if want else None)
        self._rows = rows
        return 0

    def make_sampler(self, sampling: Sampling, grammar: str | None = None) -> FakeSampler:
        if grammar is not None and "root" not in grammar:
            raise EngineError("grammar_error", "the grammar could not be parsed")
        return FakeSampler()

    def sample(self, sampler: FakeSampler, idx: int) -> int:
        """The prediction of row idx of the last batch (greedy: the sampler adds nothing)."""
        if not 0 <= idx < len(self._rows) or self._rows[idx] is None:
            raise EngineError("internal", f"batch row {idx} has no logits")
        return self._rows[idx]

    def token_logprob(self, idx: int, token: int, k: int, bias=None):
        from ..protocol import TokenLogprob, TopLogprob

        return TokenLogprob(token, -0.5, self.piece(token), [TopLogprob(token, -0.5, self.piece(token))][:k])

    def accept(self, sampler: FakeSampler, token: int) -> None:
        pass

    def grammar_from_schema(self, schema: dict) -> str:
        return "root ::= \"{}\""

    def embed(self, texts: list[str | list[int]]) -> tuple[list[list[float]], int]:
        vecs, total = [], 0
        for t in texts:
            if self.embed_seconds:
                time.sleep(self.embed_seconds)
            toks = list(t) if isinstance(t, list) else self.tokenize(t)
            counts = [0.0] * 8
            for b in toks:
                counts[b % 8] += 1.0
            norm = sum(c * c for c in counts) ** 0.5 or 1.0
            vecs.append([c / norm for c in counts])
            total += len(toks)
        if self.tick_seconds:
            time.sleep(self.tick_seconds * total / max(1, self.n_batch))  # like a prefill of these tokens
        return vecs, total

    def seq_clear(self, seq: int) -> None:
        self._match[seq] = [0]

    def seq_truncate(self, seq: int, keep: int) -> bool:
        del self._match[seq][keep + 1 :]
        return True

    def can_continue(self, seq: int, n_past: int) -> bool:
        return len(self._match[seq]) - 1 == n_past

    @property
    def n_seq_total(self) -> int:
        return self.n_seq_max + self.n_seq_idle

    def can_share(self, seq: int, n: int) -> bool:
        return True  # no sliding window: any prefix it holds can be continued

    def window_start(self, n_past: int) -> int:
        return 0

    def seq_pos_min(self, seq: int) -> int:
        return 0 if len(self._match[seq]) > 1 else -1

    def seq_copy(self, src: int, dst: int, n: int) -> None:
        pass

    def seq_relayout(self, seq: int) -> bool:
        return True  # the fake keeps no cells to lay out

    def state_seq_save(self, seq: int) -> bytes:
        return b"fake-state"  # the fake keeps no KV: any state restores to nothing

    def state_seq_load(self, seq: int, data) -> bool:
        return bytes(data) == b"fake-state"

    def state_key(self) -> dict:
        return {"model": "fake", "n_ctx": self.n_ctx}

    def state_selftest(self) -> dict:
        return {"exact_up_to": None, "complete_up_to": None, "probes": []}

    def set_threads(self, n: int | None) -> None:
        pass  # the fake's numbers do not depend on threads

    def recreate_context(self) -> None:
        self._match = [[0] for _ in range(self.n_seq_total)]
        self._rows = []

    def close(self) -> None:
        pass
