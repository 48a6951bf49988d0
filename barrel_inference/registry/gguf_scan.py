"""Pull-time scan of a GGUF header (no model load): details for `show`/`tags` and the `loader` section.

The chat template decides the tool-call format and thinking markers; the parameter count decides n_batch;
the trained context length clamped by `max_context_size` decides n_ctx.
"""

from __future__ import annotations

from pathlib import Path

from ..toolcalls import detect
from ..toolcalls.reasoning import detect_thinking
from .gguf_header import read_header

LOADER_PARAMETER_KEYS = {
    # manifest `parameters` key -> loader key it overrides
    "num_ctx": "n_ctx",
    "num_batch": "n_batch",
    "num_seq_max": "n_seq_max",
    "n_gpu_layers": "n_gpu_layers",
    "num_gpu": "n_gpu_layers",
    "main_gpu": "main_gpu",
    "use_mmap": "use_mmap",
    "use_mlock": "use_mlock",
}


def detect_tool_format(template: str | None) -> dict:
    """{'tool_format', 'tool_call_start', 'tool_call_end'}; all None when the template shows no tool calls."""
    return detect(template)


def batch_for_parameters(n_params: int | None) -> int:
    """≤13B → 2048, ≤33B → 1024, else 512 (unknown size counts as small)."""
    if n_params is None or n_params <= 13e9:
        return 2048
    if n_params <= 33e9:
        return 1024
    return 512


def format_parameter_size(n: int | None) -> str:
    if not n:
        return "unknown"
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    return f"{n / 1e3:.2f}K"


def _file_type_name(value) -> str | None:
    if value is None:
        return None
    try:
        import gguf

        name = gguf.LlamaFileType(int(value)).name
    except Exception:
        return str(value)
    for prefix in ("MOSTLY_", "ALL_"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def scan(path: Path, *, max_context_size: int = 32768) -> tuple[dict, dict]:
    """Read the header of the GGUF at `path`; return (details, loader)."""
    path = Path(path)
    meta, n_params = read_header(path)
    arch = meta.get("general.architecture") or "unknown"
    template = meta.get("tokenizer.chat_template")
    if not isinstance(template, str):
        template = None
    context_length = meta.get(f"{arch}.context_length")
    quant = _file_type_name(meta.get("general.file_type"))
    details = {
        "format": "gguf",
        "architecture": arch,
        "family": arch,
        "families": [arch],
        "parameter_count": n_params,
        "parameter_size": format_parameter_size(n_params),
        "quantization_level": quant or "unknown",
        "context_length": int(context_length) if context_length else None,
        "has_chat_template": template is not None,
        "model_name": meta.get("general.name"),
        "model_info": {k: v for k, v in meta.items() if k != "tokenizer.chat_template"},
    }
    n_ctx = min(int(context_length), max_context_size) if context_length else min(4096, max_context_size)
    loader = {
        "n_ctx": n_ctx,
        "n_batch": batch_for_parameters(n_params),
        "n_seq_max": None,  # not a property of the file: the settings' default, or the manifest's num_seq_max
        "chat_template": None,  # an override; None = the GGUF's own, else a built-in by architecture
        **detect_tool_format(template),
        **detect_thinking(template),
    }
    return details, loader


def apply_parameters(loader: dict, parameters: dict) -> dict:
    """The loader values with the manifest's `parameters` applied on top (parameters win)."""
    out = dict(loader)
    for key, target in LOADER_PARAMETER_KEYS.items():
        if parameters.get(key) is not None:
            out[target] = parameters[key]
    return out
