"""Per-tick profile of the scheduler: where the time goes (batch build, decode, sampling, detokenize, send)."""

from __future__ import annotations


class TickProfile:
    __slots__ = ("ticks", "build", "decode", "sample", "detok", "send", "tokens", "decode_rows", "prefill_rows", "max_tick")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.ticks = 0
        self.build = self.decode = self.sample = self.detok = self.send = 0.0
        self.tokens = self.decode_rows = self.prefill_rows = 0
        self.max_tick = 0.0

    def add(self, *, build: float, decode: float, sample: float, detok: float, n_tokens: int, n_decode: int, n_prefill: int) -> None:
        self.ticks += 1
        self.build += build
        self.decode += decode
        self.sample += sample
        self.detok += detok
        self.tokens += n_tokens
        self.decode_rows += n_decode
        self.prefill_rows += n_prefill
        self.max_tick = max(self.max_tick, build + decode + sample + detok)

    def add_send(self, seconds: float) -> None:
        self.send += seconds

    def as_dict(self) -> dict:
        total = self.build + self.decode + self.sample + self.detok + self.send
        per = (lambda x: 1000.0 * x / self.ticks) if self.ticks else (lambda x: 0.0)
        return {
            "ticks": self.ticks,
            "batch_tokens": self.tokens,
            "decode_rows": self.decode_rows,
            "prefill_rows": self.prefill_rows,
            "mean_batch": self.tokens / self.ticks if self.ticks else 0.0,
            "ms_per_tick": {
                "build": per(self.build),
                "decode": per(self.decode),
                "sample": per(self.sample),
                "detokenize": per(self.detok),
                "send": per(self.send),
                "total": per(total),
            },
            "seconds": {"build": self.build, "decode": self.decode, "sample": self.sample,
                        "detokenize": self.detok, "send": self.send},  # fmt: skip
            "max_tick_ms": self.max_tick * 1000.0,
        }
