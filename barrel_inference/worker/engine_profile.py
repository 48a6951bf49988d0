"""The engine profile a worker loads its model with, and why.

Two profiles:
- "default": llama.cpp's extra buffer types (CPU weight repacking, and AMX layouts where the build
  and the CPU have AMX) as `extra_buffers` says: "on", "off", or "auto" = off on CPUs with AMX,
  on elsewhere. On Intel Xeons with AMX, llama.cpp's AMX matmul segfaults on common quantisations
  (Q4_K_M; llama.cpp issue 20824); measured there, keeping the extra buffers off costs nothing on
  Gemma 3 270M (BENCHMARKS.md), while on AVX2-only and ARM CPUs the repacked layouts speed up
  some quantisations, so "auto" keeps them on there.
- "safe": extra buffers off whatever the setting: what the gateway restarts a worker with after
  it died from a signal in the default profile.
"""

from __future__ import annotations

import msgspec

from ..hostinfo import cpu_flags, has_amx

EXTRA_BUFFERS = ("auto", "on", "off")
PROFILES = ("default", "safe")


class EngineProfile(msgspec.Struct, frozen=True):
    name: str  # "default" | "safe"
    extra_buffers: bool
    reason: str


def resolve(profile: str, extra_buffers: str, flags: frozenset[str] | None = None) -> EngineProfile:
    if profile not in PROFILES:
        raise ValueError(f"engine profile must be one of {', '.join(PROFILES)}, not {profile!r}")
    if extra_buffers not in EXTRA_BUFFERS:
        raise ValueError(f"extra_buffers must be one of {', '.join(EXTRA_BUFFERS)}, not {extra_buffers!r}")
    if profile == "safe":
        return EngineProfile("safe", False, "safe profile: extra buffer types (repack, AMX) off after a crash")
    if extra_buffers == "on":
        return EngineProfile("default", True, "extra_buffers = on (operator setting)")
    if extra_buffers == "off":
        return EngineProfile("default", False, "extra_buffers = off (operator setting)")
    flags = cpu_flags() if flags is None else flags
    if has_amx(flags):
        return EngineProfile(
            "default", False,
            "extra_buffers = auto: this CPU has AMX, whose llama.cpp weight layouts crash on common quantisations",
        )  # fmt: skip
    return EngineProfile("default", True, "extra_buffers = auto: no AMX on this CPU, repacked weight layouts on")
