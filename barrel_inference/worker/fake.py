"""A fake engine with the scheduler's engine interface: no model, tokens as fast as asked.

Byte-level "vocabulary" (token = byte, plus EOS 256); each sequence emits a fixed text cyclically.
Used by gateway tests and by the gateway-overhead benchmark.
"""

from __future__ import annotations

import time

from ..protocol import Sampling
from .engine_api import EngineError

TEXT = "the quick brown fox jumps over the lazy dog "
EOS = 256


class FakeSampler:
    __slots__ = ("i",)

    def __init__(self) -> None:
        self.i = 0

    def free(self) -> None:
        pass


class FakeEngine:
    architecture = "fake"
    chat_template = None
    add_bos = False
    n_swa = 0

    def __init__(self, *, n_ctx: int = 4096, n_seq_max: int = 4, n_batch: int = 512, tps: float = 0.0, embed_seconds: float = 0.0, **_):
        self.n_ctx = n_ctx
        self.n_ctx_train = n_ctx
        self.n_seq_max = n_seq_max
        self.n_batch = n_batch
        self.n_vocab = 257
        self.tick_seconds = 1.0 / tps if tps > 0 else 0.0
        self._text = TEXT.encode()
        self.embed_seconds = embed_seconds  # time each embedding input takes
        self.max_token_chars = 1

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

    def decode(self, tokens, pos, seqs, logits) -> int:
        if self.tick_seconds:
            time.sleep(self.tick_seconds)
        return 0

    def make_sampler(self, sampling: Sampling, grammar: str | None = None) -> FakeSampler:
        if grammar is not None and "root" not in grammar:
            raise EngineError("grammar_error", "the grammar could not be parsed")
        return FakeSampler()

    def sample(self, sampler: FakeSampler, idx: int) -> int:
        tok = self._text[sampler.i % len(self._text)]
        sampler.i += 1
        return tok

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
        pass

    def seq_truncate(self, seq: int, keep: int) -> bool:
        return True

    def can_continue(self, seq: int, n_past: int) -> bool:
        return True

    def recreate_context(self) -> None:
        pass

    def close(self) -> None:
        pass
