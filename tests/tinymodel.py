"""Tiny GGUF models for tests, written with the gguf package.

A 2-layer, 64-wide llama-architecture model with a GPT-2 byte-level vocabulary (256 byte tokens,
a few merges, chat and tool specials), random F32 weights and a ChatML template. Its output is
nonsense, but it runs the real llama.cpp path in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]
MERGES = [("t", "h"), ("th", "e"), ("Ġ", "t"), ("i", "n"), ("a", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n")]


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_tiny_gguf(path: str | Path, *, chat_template: str | None = CHATML, context_length: int = 2048,
                    seed: int = 0, name: str = "tiny-test", architecture_name: str = "llama") -> Path:  # fmt: skip
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    b2u = _bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = []
    for a, b in MERGES:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    types = [gguf.TokenType.NORMAL] * len(tokens) + [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.USER_DEFINED] * 4
    tokens += SPECIALS
    V, D, L, H, FF = len(tokens), 64, 2, 4, 128
    w = gguf.GGUFWriter(str(path), architecture_name)
    w.add_name(name)
    w.add_context_length(context_length)
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(H)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(D // H)
    w.add_vocab_size(V)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(V - len(SPECIALS))  # <|endoftext|>
    w.add_eos_token_id(V - len(SPECIALS) + 2)  # <|im_end|>
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def t(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w.add_tensor("token_embd.weight", t(V, D))
    w.add_tensor("output_norm.weight", np.ones(D, np.float32))
    w.add_tensor("output.weight", t(V, D))
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(D, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(D, np.float32))
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + n + ".weight", t(D, D))
        w.add_tensor(p + "ffn_gate.weight", t(FF, D))
        w.add_tensor(p + "ffn_up.weight", t(FF, D))
        w.add_tensor(p + "ffn_down.weight", t(D, FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
