"""The llama.cpp engine: the only module that imports llama_cpp.

A thin, batch-oriented wrapper over llama-cpp-python's low-level API: one model, one context
holding n_seq_max running sequences (and n_seq_idle more that hold idle caches) in one unified KV
buffer (or each in a buffer of its own, kv_unified=False), one reusable llama_batch,
per-sequence sampler chains (samplers.py). The scheduler drives it; nothing here knows about requests or the link.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading

import llama_cpp as L
import numpy as np

from ..hostinfo import cpu_count
from ..protocol import Sampling, TokenLogprob
from . import buildinfo, kvlayout, kvwindow
from .kvselftest import state_selftest
from .kvstore import model_fingerprint
from .logprobs import log_probability
from .embedding_context import EmbeddingContext
from .samplers import Sampler, Samplers
from .engine_api import EngineError

_BACKEND_LOCK = threading.Lock()
_BACKEND_READY = False


def _backend_init() -> None:
    global _BACKEND_READY
    with _BACKEND_LOCK:
        if not _BACKEND_READY:
            L.llama_log_set(_QUIET_LOG, ctypes.c_void_p(0))
            L.llama_backend_init()
            _BACKEND_READY = True


# buffer types named in llama.cpp's load log ("load_tensors: CPU_REPACK model buffer size = ..."):
# the only place llama.cpp says which weight layouts a model got. A model loads on the calling
# thread, so the names are collected per thread, only while that thread loads one.
_LOADING = threading.local()
_BUFFER_LINE = re.compile(rb"^\s*(?:\w+:\s+)?(\S+) model buffer size")


@L.llama_log_callback
def _quiet_log(level, text, user_data):  # pragma: no cover - called from C
    if text:
        m = _BUFFER_LINE.match(text)
        names = getattr(_LOADING, "buffers", None)
        if m and names is not None:
            name = m.group(1).decode("utf-8", "replace")
            if name not in names:
                names.append(name)
        if os.environ.get("BARREL_INFERENCE_LLAMA_LOG"):
            os.write(2, text)


_QUIET_LOG = _quiet_log


def system_info() -> dict:
    """What this llama.cpp build is and sees: version, ggml's feature string, devices (buildinfo.py
    reads them through the bindings this module hands it)."""
    _backend_init()
    return buildinfo.describe(L, _ggml_lib)


def _ggml_lib():
    from llama_cpp import _ggml as G

    return G.libggml


# the flash_attn setting -> llama_context_params.flash_attn_type (LLAMA_FLASH_ATTN_TYPE_AUTO / _DISABLED / _ENABLED)
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
MAX_SEQ = 256  # llama.cpp's LLAMA_MAX_SEQ: sequence ids of one context


class LlamaEngine:
    """Model + context + batch. Not thread-safe except tokenize/detokenize (vocab is read-only).

    n_ctx is the limit of one sequence (prompt + output). At most n_seq_max sequences run at once;
    n_seq_idle more sequence ids hold idle caches (conversations between turns): n_seq_total exist.
    kv_unified True: one KV buffer of n_ctx * n_seq_max cells (so that no running sequence is
    ever short of room because others run) plus idle_cells for the idle caches; False: a buffer of
    n_ctx cells per sequence id; "auto" (the default): the latter where its memory is small
    (kvlayout.py; `kv_layout` says why).
    """

    def __init__(
        self,
        model_path: str,
        *,
        n_ctx: int = 8192,
        n_seq_max: int = 4,
        n_batch: int = 512,
        n_ubatch: int | None = None,
        threads: int | None = None,
        n_gpu_layers: int | None = None,
        main_gpu: int | None = None,
        use_mmap: bool | None = None,
        use_mlock: bool | None = None,
        extra_buffers: bool = True,
        flash_attn: str = "auto",
        swa_full: bool = False,
        n_seq_idle: int = 0,
        idle_cells: int = 0,
        kv_unified: bool | str = "auto",
    ):
        _backend_init()
        mp = L.llama_model_default_params()
        # llama.cpp's "extra buffer types" (CPU weight repacking, AMX layouts): faster on some
        # CPUs and quantisations, but the AMX one crashes on some (see worker/engine_profile.py)
        mp.use_extra_bufts = bool(extra_buffers)
        self.extra_buffers = bool(extra_buffers)
        if flash_attn not in FLASH_ATTN:
            raise EngineError("invalid_request", f"flash_attn must be one of {', '.join(FLASH_ATTN)}, not {flash_attn!r}")
        self.flash_attn = flash_attn
        self.swa_full = bool(swa_full)
        if n_gpu_layers is not None:
            mp.n_gpu_layers = n_gpu_layers if n_gpu_layers >= 0 else 0x7FFFFFFF
        if main_gpu is not None:
            mp.main_gpu = main_gpu
        if use_mmap is not None:
            mp.use_mmap = use_mmap
        if use_mlock is not None:
            mp.use_mlock = use_mlock
        self.model_path = model_path
        _LOADING.buffers = []
        try:
            self.model = L.llama_model_load_from_file(model_path.encode(), mp)
        finally:
            self._weight_buffers, _LOADING.buffers = _LOADING.buffers, None
        if not self.model:
            raise EngineError("model_not_found", f"llama.cpp could not load the model file {model_path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = L.llama_model_n_ctx_train(self.model)
        self.n_ctx = min(n_ctx, self.n_ctx_train) if self.n_ctx_train > 0 else n_ctx
        self.n_seq_max = n_seq_max
        self.n_seq_idle = max(0, min(int(n_seq_idle), MAX_SEQ - n_seq_max))
        self.architecture = self.meta("general.architecture") or "unknown"
        self.kv_unified, self.kv_layout = kvlayout.choose(kv_unified, split_bytes=self._split_kv_bytes())
        self.idle_cells = max(0, int(idle_cells)) if self.n_seq_idle and self.kv_unified else 0
        # a copy between KV buffers is queued by llama.cpp and done at the next decode: until then
        # no state is saved from the buffers it writes, nor restored into those it reads or writes
        self._copy_into: set[int] = set()
        self._copy_from: set[int] = set()
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch or n_batch
        self.threads = threads or cpu_count()  # the cores this process may run on (a replica pinned to a core set)
        self.n_swa = L.llama_model_n_swa(self.model) if hasattr(L, "llama_model_n_swa") else 0
        self.bos = L.llama_vocab_bos(self.vocab)
        self.eos = L.llama_vocab_eos(self.vocab)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        tmpl = L.llama_model_chat_template(self.model, None)
        self.chat_template = tmpl.decode("utf-8", "replace") if tmpl else None
        self._piece_cache: dict[int, bytes] = {}
        self._samplers = Samplers(L, self)
        self._eog = [False] * self.n_vocab
        self.control_tokens: dict[str, int] = {}  # control tokens by text: recognised in template text only
        longest = 1
        control = L.LLAMA_TOKEN_ATTR_CONTROL
        for t in range(self.n_vocab):
            if L.llama_vocab_is_eog(self.vocab, t):
                self._eog[t] = True
            text = L.llama_vocab_get_text(self.vocab, t) or b""
            if L.llama_vocab_get_attr(self.vocab, t) & control:
                if text:
                    self.control_tokens.setdefault(text.decode("utf-8", "replace"), t)
            elif len(text) > longest:
                longest = len(text)
        # no token covers more characters than its vocabulary text has bytes (a bound for prompt checks)
        self.max_token_chars = longest
        self.ctx = None
        self._embedding = EmbeddingContext(L, self)
        self.batch = L.llama_batch_init(self.n_batch, 0, 1)
        self._create_context()

    # ---- metadata -----------------------------------------------------------------------
    def _split_kv_bytes(self) -> int:
        """The KV cache a buffer per sequence would take: n_ctx cells for every sequence id."""
        m = self.model
        head = L.llama_model_n_embd(m) // max(1, L.llama_model_n_head(m))
        k, v = (int(self.meta(f"{self.architecture}.attention.{x}_length") or head) for x in ("key", "value"))
        per_cell = kvlayout.bytes_per_cell(L.llama_model_n_layer(m), L.llama_model_n_head_kv(m), k, v)
        return per_cell * self.n_ctx * (self.n_seq_max + self.n_seq_idle)

    def weight_buffers(self) -> list[str]:
        """Names of the buffer types the model's weights live in (e.g. CPU, CPU_REPACK, AMX, CUDA0)."""
        return list(self._weight_buffers)

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = L.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self.piece(token, special=True).decode("utf-8", "replace")

    # ---- context ------------------------------------------------------------------------
    def _new_context(self, **fields):
        """A llama.cpp context of this model: its default parameters, this engine's threads, `fields`."""
        cp = L.llama_context_default_params()
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.no_perf = True
        for name, value in fields.items():
            setattr(cp, name, value)
        return L.llama_init_from_model(self.model, cp)

    def _create_context(self) -> None:
        # unified: prefix copies share cells, idle caches get idle_cells, and the window layers get
        # headroom for a prefix idle sequences share (kvwindow.swa_headroom); but every row attends
        # over all sequences' cells. A buffer per sequence: n_ctx cells per id, whole-buffer copies,
        # a decode pass per run of consecutive running ids (README, "KV layout"; BENCHMARKS.md).
        # llama.cpp's flash attention reductions depend on where a sequence's cells lie: a restored
        # state can give other logits (Gemma 3 beyond its window); without it a restore is bit-exact.
        # Sliding-window layers with swa_full keep every position, so a cached prefix can be cut or
        # copied at any length (without it, only within the last window of what the sequence holds).
        if self.kv_unified:
            cells, ids = self.n_ctx * self.n_seq_max + self.idle_cells, self.n_seq_total + self._swa_headroom()
        else:
            cells, ids = self.n_ctx * self.n_seq_total, self.n_seq_total
        self.ctx = self._new_context(
            n_ctx=cells, n_batch=self.n_batch, n_ubatch=self.n_ubatch, n_seq_max=ids, kv_unified=self.kv_unified,
            flash_attn_type=FLASH_ATTN[self.flash_attn], swa_full=self.swa_full,
        )  # fmt: skip
        if not self.ctx:
            raise EngineError("internal", "llama.cpp could not create a context (out of memory?)")
        self.mem = L.llama_get_memory(self.ctx)
        self._copy_into.clear()
        self._copy_from.clear()

    def recreate_context(self) -> None:
        """After a failed decode: a fresh context, every sequence empty."""
        if self.ctx:
            L.llama_free(self.ctx)
        self.ctx = None
        self._create_context()

    def close(self) -> None:
        self._embedding.close()
        if self.batch is not None:
            L.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            L.llama_model_free(self.model)
            self.model = None

    # ---- tokens -------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token; control tokens render empty unless special."""
        key = token if not special else -token - 1
        cached = self._piece_cache.get(key)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        out = buf.raw[:n]
        self._piece_cache[key] = out
        return out

    def detokenize(self, tokens: list[int], special: bool = False) -> str:
        return b"".join(self.piece(t, special) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return 0 <= token < self.n_vocab and self._eog[token]

    # ---- batch + decode -----------------------------------------------------------------
    def decode(self, tokens: list[int], pos: list[int], seqs: list[int], logits: list[bool]) -> int:
        """Decode one batch; returns llama_decode's status (0 = ok)."""
        b = self.batch
        n = len(tokens)
        tok, p, nsid, sid, lg = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        for i in range(n):
            tok[i] = tokens[i]
            p[i] = pos[i]
            nsid[i] = 1
            sid[i][0] = seqs[i]
            lg[i] = logits[i]
        b.n_tokens = n
        status = L.llama_decode(self.ctx, b)
        if status != -1:  # llama.cpp performs queued buffer copies once it has checked the batch
            self._copy_into.clear()
            self._copy_from.clear()
        return status

    # ---- KV memory ----------------------------------------------------------------------
    def seq_clear(self, seq: int) -> None:
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def seq_truncate(self, seq: int, keep: int) -> bool:
        """Drop positions >= keep; False when the cache cannot (then clear the sequence)."""
        return bool(L.llama_memory_seq_rm(self.mem, seq, keep, -1))

    def seq_pos_min(self, seq: int) -> int:
        return L.llama_memory_seq_pos_min(self.mem, seq)

    def can_continue(self, seq: int, n_past: int) -> bool:
        """After truncating to n_past: does the cache still hold what new tokens attend to?

        Sliding-window layers drop cells older than the window, so a sequence cut far back
        may lack them; then the prompt must be recomputed.
        """
        if n_past <= 0:
            return True
        # -1: the sequence holds no cells at all in (the window layers of) the cache. That is what a
        # prefix copied out of a longer sequence gets when the window layers no longer hold its
        # positions: continuing there would attend to nothing in those layers
        pos_min = self.seq_pos_min(seq)
        if pos_min < 0:
            return False
        return pos_min <= self.window_start(n_past)

    def _swa_headroom(self) -> int:
        return kvwindow.swa_headroom(self.n_ctx, self.n_swa, self.swa_full, self.n_seq_idle, MAX_SEQ - self.n_seq_total,
                                     self.idle_cells)  # fmt: skip

    @property
    def n_seq_total(self) -> int:
        return self.n_seq_max + self.n_seq_idle

    def can_share(self, seq: int, n: int) -> bool:
        """Could seq's first n positions be continued at n, kept in place or copied to another
        sequence? The same test as can_continue: a copy shares the cells, so it holds what seq holds."""
        return self.can_continue(seq, n)

    def window_start(self, n_past: int) -> int:
        """The oldest position the token at n_past attends to in every layer (kvwindow.py)."""
        return kvwindow.window_start(n_past, self.n_swa, self.swa_full)

    def seq_copy(self, src: int, dst: int, n: int) -> None:
        """Give dst src's cells of positions [0, n) (no recompute). A unified cache shares the cells;
        between KV buffers llama.cpp copies the whole buffer (only that: a range is not supported),
        at the next decode, and dst then drops what lies beyond n."""
        if self.kv_unified:
            L.llama_memory_seq_cp(self.mem, src, dst, 0, n)
            return
        L.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        L.llama_memory_seq_rm(self.mem, dst, n, -1)
        self._copy_from.add(src)
        self._copy_into.add(dst)

    # ---- saved sequence state -----------------------------------------------------------
    def state_seq_save(self, seq: int) -> bytearray:
        """The sequence's KV state as bytes (a copy; the caller owns it). Empty while a copy into
        it is still queued (its cells do not hold their data yet)."""
        if seq in self._copy_into:
            return b""
        size = L.llama_state_seq_get_size(self.ctx, seq)
        if size <= 0:
            return b""
        out = bytearray(size)
        n = L.llama_state_seq_get_data(self.ctx, (ctypes.c_uint8 * size).from_buffer(out), size, seq)
        del out[n:]
        return out

    def state_seq_load(self, seq: int, data: bytes) -> bool:
        """Restore a saved state into seq (cleared first); False when llama.cpp refused it, or while a
        queued copy reads or writes seq's buffer (it would land on, or carry off, the restored data)."""
        self.seq_clear(seq)
        if not data or seq in self._copy_into or seq in self._copy_from:
            return False
        if isinstance(data, bytearray):  # no copy either way: llama.cpp only reads it
            buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        else:
            data = bytes(data)
            buf = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))
        if L.llama_state_seq_set_data(self.ctx, buf, len(data), seq) == 0:
            self.seq_clear(seq)
            return False
        return True

    def seq_relayout(self, seq: int) -> bool:
        """Lay seq's sliding-window cells out as a restore of its state would: save the window
        layers' part of its state (llama.cpp's SWA_ONLY flag) and load it back in place. A state
        holds only the window's cells, and a restore puts them from the buffer's first cell on, where
        the run that made them left them around a ring; flash attention's sums depend on where
        cells lie (kvselftest.py). A sequence relaid before it is continued goes on bit for bit as its
        restored state would. False, the sequence untouched, while a queued copy reads or writes
        its buffer (the copy would carry cells to where they no longer are); False, the sequence
        cleared, when llama.cpp refused the load."""
        if not self.n_swa:
            return True  # no window layers: a restore lays out every cell where it was
        if seq in self._copy_into or seq in self._copy_from:
            return False
        flags = L.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY
        size = L.llama_state_seq_get_size_ext(self.ctx, seq, flags)
        out = bytearray(max(0, size))
        if not out:
            self.seq_clear(seq)
            return False
        buf = (ctypes.c_uint8 * size).from_buffer(out)
        n = L.llama_state_seq_get_data_ext(self.ctx, buf, size, seq, flags)
        if n <= 0 or L.llama_state_seq_set_data_ext(self.ctx, buf, n, seq, flags) == 0:
            self.seq_clear(seq)
            return False
        return True

    def state_key(self) -> dict:
        """What saved states depend on besides the tokens: the model file and the settings that
        change the KV contents or the numerics of the computation that made them."""
        return {
            "model": model_fingerprint(self.model_path), "llama_cpp": getattr(L, "__version__", "?"), "n_ctx": self.n_ctx,
            "n_batch": self.n_batch, "n_ubatch": self.n_ubatch, "kv_unified": self.kv_unified, "n_swa": self.n_swa,
            "flash_attn": self.flash_attn, "swa_full": self.swa_full,
        }  # fmt: skip

    def state_selftest(self) -> dict:
        """Does a saved sequence state restore exactly? (kvselftest.py; run on an idle context)"""
        return state_selftest(self)

    def set_threads(self, n: int | None) -> None:
        """Threads for the decodes that follow (None: the engine's own). The KV self-test decodes
        at one thread, where flash attention sums a token's cells in one share (kvselftest.py)."""
        k = n or self.threads
        L.llama_set_n_threads(self.ctx, k, k)

    def logits(self, row: int) -> np.ndarray:
        """The logits of batch row `row` (a view, valid until the next decode)."""
        return np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))

    # ---- embeddings ---------------------------------------------------------------------
    def embed(self, texts: list[str | list[int]]) -> tuple[list[list[float]], int]:
        """Mean-pooled, L2-normalised embeddings of texts or token-id lists (embedding_context.py)."""
        return self._embedding.embed(texts)

    # ---- sampling -----------------------------------------------------------------------
    def grammar_from_schema(self, schema: dict) -> str:
        from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf
        import json

        if not schema:
            return JSON_GBNF
        try:
            return json_schema_to_gbnf(json.dumps(schema))
        except Exception as exc:  # the converter raises plain exceptions on unsupported schemas
            raise EngineError("grammar_error", f"response_format JSON schema cannot be enforced: {exc}") from exc

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """(prefix, suffix, middle) fill-in-the-middle tokens, or None when the vocabulary lacks one."""
        ids = (L.llama_vocab_fim_pre(self.vocab), L.llama_vocab_fim_suf(self.vocab), L.llama_vocab_fim_mid(self.vocab))
        return ids if all(0 <= t < self.n_vocab for t in ids) else None

    def token_logprob(self, idx: int, token: int, k: int, bias: dict[int, float] | None = None) -> TokenLogprob:
        """`token`'s log-probability at batch row idx under the logits after the logit bias, and the k
        most likely tokens there (k <= 20)."""
        return log_probability(self.logits(idx), token, k, bias, self.piece)

    def make_sampler(self, s: Sampling, grammar: str | None = None) -> Sampler:
        """A sequence's sampler chain (samplers.py)."""
        return self._samplers.make(s, grammar)

    def accept(self, sampler: Sampler, token: int) -> None:
        """A token chosen without sampling (forced): the chain's grammar and penalties still see it."""
        self._samplers.accept(sampler, token)

    def sample(self, sampler: Sampler, idx: int) -> int:
        """Sample from the logits of batch row idx; the chain accepts the token."""
        return self._samplers.sample(sampler, idx)
