"""Embeddings: a second llama.cpp context of the engine's model, made on first use.

It drives llama.cpp through the bindings the engine hands it (engine.py is the only module that
imports llama_cpp). The worker calls it from its embedding thread (server.Embedder), never the
scheduler's.
"""

from __future__ import annotations

import numpy as np

from .engine_api import EngineError


class EmbeddingContext:
    def __init__(self, bindings, engine):
        self.L = bindings
        self.engine = engine
        self.ctx = None
        self.batch = None

    def embed(self, texts: list[str | list[int]]) -> tuple[list[list[float]], int]:
        """Mean-pooled, L2-normalised embeddings of texts or token-id lists, and the tokens they took."""
        L, e = self.L, self.engine
        if self.ctx is None:
            self.ctx = e._new_context(n_ctx=e.n_ctx, n_batch=e.n_ctx, n_ubatch=e.n_ctx, n_seq_max=1, embeddings=True,
                                      pooling_type=L.LLAMA_POOLING_TYPE_MEAN)  # fmt: skip
            if not self.ctx:
                raise EngineError("internal", "llama.cpp could not create an embedding context")
            self.batch = L.llama_batch_init(e.n_ctx, 0, 1)
        ctx, b = self.ctx, self.batch
        n_embd = L.llama_model_n_embd(e.model)
        out, total = [], 0
        for i, text in enumerate(texts):
            toks = list(text) if isinstance(text, list) else e.tokenize(text, add_special=True, parse_special=False)
            if not toks:
                raise EngineError("invalid_request", f"input[{i}] is empty")
            if len(toks) > e.n_ctx:
                raise EngineError("context_length_exceeded", f"input[{i}] has {len(toks)} tokens; at most {e.n_ctx} fit")
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            for j, t in enumerate(toks):
                b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = t, j, 1, True
                b.seq_id[j][0] = 0
            b.n_tokens = len(toks)
            if L.llama_decode(ctx, b) != 0:
                raise EngineError("decode_failed", "llama_decode failed while embedding")
            vec = np.ctypeslib.as_array(L.llama_get_embeddings_seq(ctx, 0), shape=(n_embd,)).astype(np.float64)
            norm = float(np.linalg.norm(vec)) or 1.0
            out.append((vec / norm).tolist())
            total += len(toks)
        return out, total

    def close(self) -> None:
        if self.ctx:
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ctx)
            self.ctx = self.batch = None
