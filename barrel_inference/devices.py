"""Where one replica of a model runs: an entry of a model's `devices = [...]` (one per replica).

Forms:
  "0", "1", "0,1", "GPU-8f3c...", "gpu:0", "cuda:1"   GPU ids: the worker process gets
      CUDA_VISIBLE_DEVICES (and HIP_VISIBLE_DEVICES) set to them, so llama.cpp sees only those GPUs
      (the first of them is its device 0; `main_gpu` counts among them)
  "0-7", "0-3,8-11", "cpu:0-7", "cpu:3"                 a CPU core set: the worker pins itself to
      those cores (sched_setaffinity) before it loads the model, and its default thread count is
      their number. A bare list needs a range ("0-7") to read as cores; "cpu:" says it outright.

Pure: no I/O, used by the config's validation and by the gateway when it spawns a replica.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_CORES = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_GPU = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:,-]*$")
MAX_CORE = 65535


class Device(NamedTuple):
    kind: str  # "gpu" or "cpu"
    spec: str  # GPU ids as given, or the core list normalised ("0-3,8")
    cores: frozenset[int] = frozenset()


def parse_cores(text: str) -> frozenset[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}; ValueError on anything else."""
    text = text.replace(" ", "")
    if not _CORES.match(text):
        raise ValueError(f"{text!r} is not a core list such as 0-7 or 0-3,8-11")
    cores: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if a > b or b > MAX_CORE:
            raise ValueError(f"the core range {part!r} is empty or out of range")
        cores.update(range(a, b + 1))
    return frozenset(cores)


def core_list(cores: frozenset[int] | set[int]) -> str:
    """{0, 1, 2, 3, 8} -> '0-3,8' (what `--cpu-affinity` and taskset take)."""
    out: list[str] = []
    ordered = sorted(cores)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def parse_device(text: str) -> Device:
    """A `devices` entry as a Device; ValueError saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a device is a GPU id such as \"0\" or a CPU core set such as \"0-7\" / \"cpu:0-7\"")
    s = text.strip()
    low = s.lower()
    if low.startswith("cpu:"):
        cores = parse_cores(s[4:])
        return Device("cpu", core_list(cores), cores)
    for prefix in ("gpu:", "cuda:"):
        if low.startswith(prefix):
            s = s[len(prefix):]
            break
    else:
        if "-" in s and _CORES.match(s.replace(" ", "")):
            cores = parse_cores(s)
            return Device("cpu", core_list(cores), cores)
    if not _GPU.match(s):
        raise ValueError(f"{text!r} is neither a GPU id (\"0\", \"0,1\", a GPU UUID) nor a CPU core set (\"0-7\", \"cpu:0-7\")")
    return Device("gpu", s)


def device_env(device: Device | None) -> dict[str, str]:
    """Environment of a replica's worker process for `device`."""
    if device is None or device.kind != "gpu":
        return {}
    return {"CUDA_VISIBLE_DEVICES": device.spec, "HIP_VISIBLE_DEVICES": device.spec}


def device_argv(device: Device | None) -> list[str]:
    """Worker flags for `device`: a core set pins the worker (`--cpu-affinity`)."""
    if device is None or device.kind != "cpu":
        return []
    return ["--cpu-affinity", device.spec]
