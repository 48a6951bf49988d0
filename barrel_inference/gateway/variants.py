"""A second worker of one model with other engine settings, for requests that ask for them.

Ollama reloads a model when a request's loader options (num_ctx, num_batch, num_thread, num_gpu, ...) differ
from the loaded runner's, which cuts off every other client's stream. Here such a request gets a worker of its
own (a *variant*: the same GGUF, the asked settings) while the model's usual worker keeps serving the others.
A variant is named `name:tag (num_ctx=16384)` in /api/ps, counts against max_loaded_models / max_loaded_bytes
and expires by keep_alive like any model.

What it costs: a second process loading the same file (weights are memory-mapped, so the page cache shares
them; the KV cache of the variant is its own: n_ctx x n_seq_max cells) and the load time for the first request.
A smaller num_ctx than the loaded worker's runs on the loaded worker (its context is only larger), as does a
value the model cannot give (n_ctx is capped by the model's own context).
"""

from __future__ import annotations

from typing import Any

import msgspec

from .process import engine_options

# engine setting -> the Ollama option that asks for it (for the variant's name)
OPTION_OF = {"n_ctx": "num_ctx", "n_batch": "num_batch", "threads": "num_thread", "n_gpu_layers": "num_gpu",
             "main_gpu": "main_gpu", "use_mmap": "use_mmap", "use_mlock": "use_mlock"}  # fmt: skip


class Variant:
    """A registry record seen through engine overrides: its own name, the base's everything else."""

    def __init__(self, base: Any, overrides: dict) -> None:
        self.base = base
        self.overrides = dict(overrides)
        shown = ", ".join(f"{OPTION_OF.get(k, k)}={v}" for k, v in sorted(self.overrides.items()))
        self.name = f"{base.name} ({shown})"

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.base, attr)


def is_variant(record: Any) -> bool:
    return isinstance(record, Variant)


def needed(settings: Any, record: Any, asked: dict | None) -> dict:
    """The overrides among `asked` that a worker with the model's own settings cannot serve."""
    if not asked:
        return {}
    opts = engine_options(settings, record)
    if opts.endpoint:  # a worker elsewhere is what it is
        return {}
    out = {}
    for key, value in asked.items():
        if key not in OPTION_OF:
            continue
        have = getattr(opts, key, None)
        if key == "n_ctx":
            cap = int((getattr(record, "loader", None) or {}).get("n_ctx") or value)
            value = min(int(value), cap)
            if have is not None and value <= have:
                continue  # a smaller context fits in the loaded one
        elif have == value:
            continue
        out[key] = value
    return out


def with_overrides(settings: Any, record: Any, asked: dict | None) -> Any:
    extra = needed(settings, record, asked)
    return Variant(record, extra) if extra else record


def variant_options(settings: Any, record: Any) -> Any:
    """engine_options of the base record (the operator's per-model section included), overrides on top."""
    if not is_variant(record):
        return engine_options(settings, record)
    return msgspec.structs.replace(engine_options(settings, record.base), **record.overrides)
