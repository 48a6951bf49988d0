"""Ollama `options` (and Modelfile PARAMETERs) to engine terms: sampling, stop, max tokens and loader settings.

Every option Ollama knows is accepted. Each is checked for its type, and a value of the wrong type or an
unknown name gets a 400 naming it (Ollama only logs unknown names; a typo silently doing nothing is worse).
Options that this engine has no use for (mirostat, tfs_z, penalize_newline, num_keep, numa, low_vram, ...)
are accepted and have no effect, as in Ollama's own newer engine.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any

from ...protocol import Sampling
from ..errors import invalid

INT, FLOAT, BOOL, STRINGS = "an integer", "a number", "true or false", "a list of strings"

# name -> expected type
KNOWN: dict[str, str] = {
    # sampling
    "num_predict": INT, "temperature": FLOAT, "top_k": INT, "top_p": FLOAT, "min_p": FLOAT, "typical_p": FLOAT,
    "repeat_penalty": FLOAT, "repeat_last_n": INT, "presence_penalty": FLOAT, "frequency_penalty": FLOAT,
    "seed": INT, "stop": STRINGS, "num_keep": INT,
    "mirostat": INT, "mirostat_tau": FLOAT, "mirostat_eta": FLOAT, "tfs_z": FLOAT, "penalize_newline": BOOL,
    # loader
    "num_ctx": INT, "num_batch": INT, "num_thread": INT, "num_gpu": INT, "main_gpu": INT,
    "use_mmap": BOOL, "use_mlock": BOOL, "numa": BOOL, "low_vram": BOOL, "vocab_only": BOOL, "f16_kv": BOOL,
    "logits_all": BOOL, "embedding_only": BOOL,
}  # fmt: skip

# options that choose how the model is loaded -> the engine setting they set
LOADER: dict[str, str] = {
    "num_ctx": "n_ctx", "num_batch": "n_batch", "num_thread": "threads", "num_gpu": "n_gpu_layers",
    "main_gpu": "main_gpu", "use_mmap": "use_mmap", "use_mlock": "use_mlock",
}  # fmt: skip

_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
             "presence_penalty", "frequency_penalty", "seed")  # fmt: skip


@dataclass
class Options:
    sampling: Sampling = field(default_factory=Sampling)
    stop: list[str] = field(default_factory=list)
    max_tokens: int | None = None
    ignore_eos: bool = False
    loader: dict[str, Any] = field(default_factory=dict)  # engine settings asked for (n_ctx, n_batch, ...)


def _bad(name: str, want: str, value: Any, where: str) -> Exception:
    shown = "null" if value is None else repr(value)
    return invalid(f"option {name!r} must be {want}, got {shown}", f"{where}.{name}")


def check_value(name: str, value: Any, where: str = "options") -> Any:
    """The value of one known option, coerced to its type (an integral float is an int); 400 otherwise."""
    want = KNOWN[name]
    if want == BOOL:
        if isinstance(value, bool):
            return value
        raise _bad(name, want, value, where)
    if want == STRINGS:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise _bad(name, want, value, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(name, want, value, where)
    if want == INT:
        if isinstance(value, float):
            if not value.is_integer():
                raise _bad(name, want, value, where)
            value = int(value)
        if abs(value) >= 2**63:
            raise invalid(f"option {name!r} is out of range ({value})", f"{where}.{name}")
        return value
    value = float(value)
    if not math.isfinite(value):
        raise _bad(name, "a finite number", value, where)
    return value


def unknown(name: str, where: str = "options") -> Exception:
    close = difflib.get_close_matches(name, list(KNOWN), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return invalid(f"unknown option {name!r}{hint}", f"{where}.{name}")


def validate(options: dict | None, where: str = "options") -> dict[str, Any]:
    """Known names only, each of its type (coerced)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise invalid(f"{where} must be an object", where)
    out = {}
    for name, value in options.items():
        if name not in KNOWN:
            raise unknown(name, where)
        if value is None:  # clients send explicit nulls for "unset"
            continue
        out[name] = check_value(name, value, where)
    return out


def to_engine(params: dict[str, Any], options: dict[str, Any]) -> Options:
    """The model's PARAMETERs (manifest `parameters`, already typed) overlaid by the request's checked options."""
    merged = {k: v for k, v in (params or {}).items() if k in KNOWN}
    merged.update(options)
    out = Options()
    s = out.sampling
    for name in _SAMPLING:
        if name in merged:
            setattr(s, name, merged[name])
    if "stop" in merged:
        stops = merged["stop"] if isinstance(merged["stop"], list) else [merged["stop"]]
        if any(x == "" for x in stops):
            raise invalid("stop sequences must not be empty", "options.stop")
        out.stop = list(stops)
    n = merged.get("num_predict")
    if n is not None:
        if n == -2:
            out.ignore_eos = True  # fill the context
        elif n < -2:
            raise invalid(f"option 'num_predict' must be >= -2 (-1: until the context is full, -2: fill it), got {n}", "options.num_predict")
        elif n >= 0:
            out.max_tokens = n
    for name, setting in LOADER.items():
        if name in options:  # the request's own loader options; the model's were applied when it was loaded
            out.loader[setting] = options[name]
    if "num_ctx" in options and options["num_ctx"] <= 0:
        raise invalid(f"option 'num_ctx' must be positive, got {options['num_ctx']}", "options.num_ctx")
    return out
