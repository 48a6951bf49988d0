"""Tiny GGUF models for tests, written with the gguf package.

A 2-layer, 64-wide llama-architecture model with a GPT-2 byte-level vocabulary (256 byte tokens,
a few merges, chat and tool specials), random F32 weights and a ChatML template. Its output is
nonsense, but it runs the real llama.cpp path in milliseconds.

`flavour` picks the special tokens and the chat template of a real model family, with its markers
as CONTROL tokens the way the real vocabularies have them (rendered only with special text):
"qwen2.5" (<tool_call>, <think>, the Qwen 2.5 template), "llama3.1" (<|python_tag|>, <|eom_id|>,
the Llama 3.1 template) and "mistral" ([TOOL_CALLS], the Mistral 7B v0.3 template). The default,
"chatml", keeps the original vocabulary (tool and thinking markers as USER_DEFINED tokens).
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


_TEMPLATES = Path(__file__).parent / "chat_templates"


def real_template(name: str) -> str:
    """A real model family's chat template, kept under tests/chat_templates/."""
    return (_TEMPLATES / f"{name}.jinja").read_text()


# flavour -> (special tokens, how many of them are CONTROL (the rest USER_DEFINED), bos, eos, add_bos, template)
FLAVOURS: dict[str, tuple[list[str], int, str, str, bool, str | None]] = {
    "chatml": (SPECIALS, 3, "<|endoftext|>", "<|im_end|>", False, None),
    "qwen2.5": (SPECIALS, len(SPECIALS), "<|endoftext|>", "<|im_end|>", False, "qwen2.5"),
    "llama3.1": (
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
        7, "<|begin_of_text|>", "<|eot_id|>", True, "llama3.1",
    ),
    "mistral": (
        ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
        9, "<s>", "</s>", True, "mistral-v0.3",
    ),
}
_FLAVOUR_TEMPLATE = object()


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


def write_tiny_gguf(path: str | Path, *, chat_template: str | None = _FLAVOUR_TEMPLATE, context_length: int = 2048,
                    seed: int = 0, name: str = "tiny-test", architecture_name: str = "llama",
                    flavour: str = "chatml") -> Path:  # fmt: skip
    """chat_template: Jinja text, None for none, or (unset) the flavour's own (ChatML for "chatml")."""
    import gguf

    specials, n_control, bos, eos, add_bos, template_name = FLAVOURS[flavour]
    if chat_template is _FLAVOUR_TEMPLATE:
        chat_template = real_template(template_name) if template_name else CHATML

    path = Path(path)
    rng = np.random.default_rng(seed)
    b2u = _bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = []
    for a, b in MERGES:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    types = [gguf.TokenType.NORMAL] * len(tokens) + [gguf.TokenType.CONTROL] * n_control
    types += [gguf.TokenType.USER_DEFINED] * (len(specials) - n_control)
    n_plain = len(tokens)
    tokens += specials
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
    w.add_bos_token_id(n_plain + specials.index(bos))
    w.add_eos_token_id(n_plain + specials.index(eos))
    w.add_add_bos_token(add_bos)
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
