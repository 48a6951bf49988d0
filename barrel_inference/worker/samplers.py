"""Sampler chains of the llama.cpp engine: built from a request's Sampling (and grammar), sampled
from a batch row's logits, told of forced tokens.

It drives llama.cpp through the bindings the engine hands it (engine.py is the only module that
imports llama_cpp), and reads the engine's vocabulary, context and logits.
"""

from __future__ import annotations

import ctypes
import re
import threading

import numpy as np

from ..protocol import Sampling
from .engine_api import EngineError
from .grammar_stages import best_allowed

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data
# candidates checked by the grammar before it sees the whole vocabulary: the best by logit first
GRAMMAR_STAGES = (64, 4096, 32768)


class Sampler:
    """One sequence's sampler chain (owned; free() releases it).

    Plain greedy decoding (with at most a logit bias) skips the chain: an argmax over the logits
    in place gives the same token as llama.cpp's greedy sampler (first maximum wins) without
    building a candidate array of the whole vocabulary for every token.

    With a grammar the chain is in three parts (`pre`: logit bias and penalties, `grammar`, `post`:
    greedy or top-k ... dist) so that the grammar, whose cost grows with the candidates it checks,
    first checks only the best candidates (see Samplers._sample_constrained).
    """

    __slots__ = ("L", "chain", "greedy_bias", "pre", "grammar", "post", "greedy", "top_k")

    def __init__(self, bindings, chain, greedy_bias: tuple[np.ndarray, np.ndarray] | None = None):
        self.L = bindings
        self.chain = chain
        self.greedy_bias = greedy_bias
        self.pre = self.grammar = self.post = None
        self.greedy = False
        self.top_k = 0

    def free(self) -> None:
        for name in ("chain", "pre", "grammar", "post"):
            smpl = getattr(self, name)
            if smpl is not None:
                self.L.llama_sampler_free(smpl)
                setattr(self, name, None)


class Samplers:
    """The engine's sampling: LlamaEngine.make_sampler / accept / sample are these."""

    def __init__(self, bindings, engine):
        self.L = bindings
        self.engine = engine
        self._never_utf8: list[int] | None = None
        self._never_utf8_lock = threading.Lock()

    def never_utf8_tokens(self) -> list[int]:
        """Tokens holding a byte no UTF-8 text contains (C0, C1, F5..FF). llama.cpp's grammar decodes
        such bytes as code points anyway, so under a grammar they are banned. Computed once."""
        L, e = self.L, self.engine
        with self._never_utf8_lock:
            if self._never_utf8 is None:
                bad = re.compile(b"[\xc0\xc1\xf5-\xff]")
                buf = ctypes.create_string_buffer(256)
                out = []
                for t in range(e.n_vocab):
                    n = L.llama_token_to_piece(e.vocab, t, buf, 256, 0, False)
                    if n > 0 and bad.search(buf.raw[:n]):
                        out.append(t)
                self._never_utf8 = out
            return self._never_utf8

    def make(self, s: Sampling, grammar: str | None = None) -> Sampler:
        L, n_vocab = self.L, self.engine.n_vocab
        plain = grammar is None and s.repeat_penalty == 1.0 and not s.presence_penalty and not s.frequency_penalty
        if s.temperature <= 0 and plain:
            items = sorted((t, b) for t, b in s.logit_bias.items() if 0 <= t < n_vocab)
            bias = (np.array([t for t, _ in items], np.int64), np.array([b for _, b in items], np.float32))
            return Sampler(L, None, bias)
        sampler = Sampler(L, None)
        try:
            pre = self._chain()
            items = [(t, b) for t, b in s.logit_bias.items() if 0 <= t < n_vocab]
            if grammar is not None:  # no byte that is never valid UTF-8 (the grammar reads code points)
                items += [(t, float("-inf")) for t in self.never_utf8_tokens()]
            if items:
                arr = (L.llama_logit_bias * len(items))()
                for i, (t, bias) in enumerate(items):
                    arr[i].token = t
                    arr[i].bias = bias
                L.llama_sampler_chain_add(pre, L.llama_sampler_init_logit_bias(n_vocab, len(items), arr))
            if s.repeat_penalty != 1.0 or s.presence_penalty or s.frequency_penalty:
                L.llama_sampler_chain_add(pre, L.llama_sampler_init_penalties(
                    n_vocab, s.repeat_last_n, s.repeat_penalty, s.frequency_penalty, s.presence_penalty))  # fmt: skip
            sampler.pre = pre
            if grammar is not None:
                g = L.llama_sampler_init_grammar(self.engine.vocab, grammar.encode(), b"root")
                if not g:
                    raise EngineError("grammar_error", "the grammar could not be parsed")
                sampler.grammar = g
            post = self._chain()
            sampler.post = post
            if s.temperature <= 0:
                L.llama_sampler_chain_add(post, L.llama_sampler_init_greedy())
                sampler.greedy = True
            else:
                if s.top_k > 0:
                    L.llama_sampler_chain_add(post, L.llama_sampler_init_top_k(s.top_k))
                    sampler.top_k = s.top_k
                if s.top_p < 1.0:
                    L.llama_sampler_chain_add(post, L.llama_sampler_init_top_p(s.top_p, 1))
                if 0.0 < s.typical_p < 1.0:
                    L.llama_sampler_chain_add(post, L.llama_sampler_init_typical(s.typical_p, 1))
                if s.min_p > 0.0:
                    L.llama_sampler_chain_add(post, L.llama_sampler_init_min_p(s.min_p, 1))
                L.llama_sampler_chain_add(post, L.llama_sampler_init_temp(s.temperature))
                seed = s.seed if s.seed is not None else L.LLAMA_DEFAULT_SEED
                L.llama_sampler_chain_add(post, L.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        except BaseException:
            sampler.free()
            raise
        if grammar is None:  # one chain, sampled by llama.cpp as before
            chain = self._chain()
            for part in (sampler.pre, sampler.post):
                while L.llama_sampler_chain_n(part) > 0:
                    L.llama_sampler_chain_add(chain, L.llama_sampler_chain_remove(part, 0))
            sampler.free()
            sampler.chain = chain
        return sampler

    def accept(self, sampler: Sampler, token: int) -> None:
        """A token chosen without sampling (forced): the chain's grammar and penalties still see it."""
        for smpl in (sampler.chain, sampler.pre, sampler.grammar, sampler.post):
            if smpl is not None:
                self.L.llama_sampler_accept(smpl, token)

    def _chain(self):
        return self.L.llama_sampler_chain_init(self.L.llama_sampler_chain_default_params())

    def _apply(self, smpl, cand: np.ndarray) -> tuple[int, int]:
        """Run `smpl` over a candidate array in place; (size after, selected index)."""
        L = self.L
        arr = L.llama_token_data_array(cand.ctypes.data_as(L.llama_token_data_p), len(cand), -1, False)
        L.llama_sampler_apply(smpl, ctypes.byref(arr))
        n = int(arr.size)
        moved = ctypes.cast(arr.data, ctypes.c_void_p).value
        if n and moved != cand.ctypes.data:  # a sampler moved the data: copy it back
            cand[:n] = np.ctypeslib.as_array(ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_byte)), shape=(n * _TOKEN_DATA.itemsize,)).view(_TOKEN_DATA)
        return n, int(arr.selected)

    def _sample_constrained(self, sampler: Sampler, idx: int) -> int:
        """Sample under a grammar, which checks the best candidates by logit first (GRAMMAR_STAGES, see
        grammar_stages.py) and the whole vocabulary only when too few of those are allowed."""
        n_vocab = self.engine.n_vocab
        logits = self.engine.logits(idx)
        cand = np.empty(n_vocab, _TOKEN_DATA)
        cand["id"] = np.arange(n_vocab, dtype=np.int32)
        cand["logit"] = logits
        cand["p"] = 0.0
        n, _ = self._apply(sampler.pre, cand)
        cand = cand[:n]
        need = 1 if sampler.greedy else sampler.top_k
        chosen = best_allowed(cand, need, lambda sub: self._apply(sampler.grammar, sub), GRAMMAR_STAGES)
        if chosen is None:
            self._apply(sampler.grammar, cand)
            chosen = cand
        size, selected = self._apply(sampler.post, chosen)
        if not 0 <= selected < size:
            raise EngineError("internal", "the sampler selected no token")
        token = int(chosen["id"][selected])
        for smpl in (sampler.pre, sampler.grammar, sampler.post):
            self.L.llama_sampler_accept(smpl, token)
        return token

    def sample(self, sampler: Sampler, idx: int) -> int:
        """Sample from the logits of batch row idx; the chain accepts the token."""
        if sampler.greedy_bias is not None:
            logits = self.engine.logits(idx)
            tokens, bias = sampler.greedy_bias
            if len(tokens):
                logits[tokens] += bias  # this row's logits are ours until the next decode
            return int(logits.argmax())
        if sampler.grammar is not None:
            return self._sample_constrained(sampler, idx)
        return self.L.llama_sampler_sample(sampler.chain, self.engine.ctx, idx)
