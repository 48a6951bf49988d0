"""A random-weight llama-architecture GGUF of a chosen size, for throughput runs where a real model
cannot be used (a machine without network, a size no real small model has).

    python -m bench.randmodel OUT.gguf [--dim 2048 --layers 16 --ff 5632 --heads 16 --kv-heads 4] [--type f16]

Speed depends on the shapes and the weight type, not on the values, so one random tensor of each
shape is shared by every layer (writing a 1 B model takes seconds). The vocabulary is small and
printable ASCII only (GPT-2 byte-level pieces for the bytes 0x20..0x7e, tab and newline, some merges,
three ChatML control tokens), so whatever random token a server samples decodes to whole
characters: no stream is held back waiting for the rest of a UTF-8 sequence. The chat template is
ChatML; `<|im_end|>` is EOS. `suppress_ids()` gives the control tokens' ids, to bias away so that
every stream runs to max_tokens. The output is nonsense.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# frequent English pairs, so prompts tokenise into fewer pieces than characters
MERGES = [("t", "h"), ("th", "e"), ("Ġ", "t"), ("Ġt", "he"), ("i", "n"), ("a", "n"), ("Ġ", "a"), ("e", "r"),
          ("o", "n"), ("r", "e"), ("e", "n"), ("o", "r"), ("Ġ", "s"), ("Ġ", "w"), ("i", "s"), ("a", "t")]  # fmt: skip


def _byte_piece(b: int) -> str:
    """GPT-2's printable stand-in for a byte (only the bytes this vocabulary has)."""
    if 0x21 <= b <= 0x7E:
        return chr(b)
    return {0x20: "Ġ", 0x0A: "Ċ", 0x09: "ĉ"}[b]


def vocabulary() -> tuple[list[str], list[str]]:
    """(tokens without the specials, merges)."""
    tokens = [_byte_piece(b) for b in [0x09, 0x0A, *range(0x20, 0x7F)]]
    merges = []
    for a, b in MERGES:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    return tokens, merges


def suppress_ids() -> list[int]:
    """The control tokens' ids (EOS among them)."""
    n = len(vocabulary()[0])
    return list(range(n, n + len(SPECIALS)))


def n_params(dim: int, layers: int, ff: int, heads: int, kv_heads: int, vocab: int) -> int:
    kv = dim * (dim // heads) * kv_heads
    per_layer = 2 * dim * dim + 2 * kv + 3 * dim * ff + 2 * dim
    return layers * per_layer + 2 * vocab * dim + dim


def write(path: str | Path, *, dim: int = 2048, layers: int = 16, ff: int = 5632, heads: int = 16, kv_heads: int = 4,
          wtype: str = "f16", context_length: int = 8192, seed: int = 0, name: str = "random-llama") -> dict:  # fmt: skip
    """Write the model; return its facts (parameters, bytes, suppress ids, shapes)."""
    import gguf

    if dim % heads or heads % kv_heads:
        raise ValueError("dim must be a multiple of heads, and heads of kv_heads")
    ftype, dtype = {"f16": (gguf.LlamaFileType.MOSTLY_F16, np.float16), "f32": (gguf.LlamaFileType.ALL_F32, np.float32)}[wtype]
    path = Path(path)
    rng = np.random.default_rng(seed)
    plain, merges = vocabulary()
    tokens = plain + SPECIALS
    types = [gguf.TokenType.NORMAL] * len(plain) + [gguf.TokenType.CONTROL] * len(SPECIALS)
    V, hd = len(tokens), dim // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(context_length)
    w.add_embedding_length(dim)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(V)
    w.add_file_type(ftype)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(len(plain) + SPECIALS.index("<|endoftext|>"))
    w.add_eos_token_id(len(plain) + SPECIALS.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    def t(*shape, scale=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)

    ones = np.ones(dim, np.float32)  # norms stay F32, as converters write them
    wq, wk, wv, wo = t(dim, dim), t(hd * kv_heads, dim), t(hd * kv_heads, dim), t(dim, dim)
    gate, up, down = t(ff, dim), t(ff, dim), t(dim, ff)
    w.add_tensor("token_embd.weight", t(V, dim, scale=1.0))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", t(V, dim))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", wq)
        w.add_tensor(p + "attn_k.weight", wk)
        w.add_tensor(p + "attn_v.weight", wv)
        w.add_tensor(p + "attn_output.weight", wo)
        w.add_tensor(p + "ffn_gate.weight", gate)
        w.add_tensor(p + "ffn_up.weight", up)
        w.add_tensor(p + "ffn_down.weight", down)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {
        "path": str(path), "bytes": path.stat().st_size, "params": n_params(dim, layers, ff, heads, kv_heads, V),
        "type": wtype, "dim": dim, "layers": layers, "ff": ff, "heads": heads, "kv_heads": kv_heads, "vocab": V,
        "context_length": context_length, "suppress_ids": suppress_ids(),
    }  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.randmodel", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--ff", type=int, default=5632)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--type", dest="wtype", choices=("f16", "f32"), default="f16")
    p.add_argument("--ctx", type=int, default=8192, help="the model's context length")
    a = p.parse_args(argv)
    facts = write(a.out, dim=a.dim, layers=a.layers, ff=a.ff, heads=a.heads, kv_heads=a.kv_heads, wtype=a.wtype, context_length=a.ctx)
    json.dump(facts, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
