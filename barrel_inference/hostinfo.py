"""What this host is, read without loading llama.cpp: CPU features, a CPU signature, the engine build.

Used by the gateway (to key remembered engine fallbacks) and by the worker (to resolve
`extra_buffers = "auto"`). Reading /proc/cpuinfo and file metadata only; nothing here imports
llama_cpp (importlib's find_spec locates the package without executing it).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
from pathlib import Path

# CPU features whose kernels llama.cpp's "extra buffer types" use for weight layouts
AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo "flags", ARM "Features"); empty where unknown."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_model(cpuinfo: str | None = None) -> str:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware", "CPU part"):
            return value.strip()
    return platform.processor() or platform.machine()


def has_amx(flags: frozenset[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return any(f in flags for f in AMX_FLAGS)


def cpu_signature(cpuinfo: str | None = None) -> str:
    """A short, stable id of the CPU kind: architecture, model name and feature flags."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    flags = sorted(cpu_flags(cpuinfo))
    text = "|".join([platform.machine(), cpu_model(cpuinfo), " ".join(flags)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def llama_cpp_version() -> str:
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def llama_lib_dir() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent / "lib"


def llama_build_id() -> str:
    """An id of the installed llama.cpp build: version plus the size and mtime of its shared libraries.

    A rebuild with other flags (CMAKE_ARGS) gives new libraries and so a new id, which is what a
    remembered fallback must be keyed by.
    """
    parts = [llama_cpp_version()]
    lib = llama_lib_dir()
    if lib is not None and lib.is_dir():
        for f in sorted(lib.iterdir()):
            if f.suffix in (".so", ".dylib", ".dll") or ".so." in f.name:
                try:
                    st = f.stat()
                except OSError:
                    continue
                parts.append(f"{f.name}:{st.st_size}:{int(st.st_mtime)}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def build_flags_file() -> Path | None:
    """Where scripts/setup records the CMAKE_ARGS llama-cpp-python was built with (in the venv)."""
    import sys

    path = Path(sys.prefix) / ".barrel-inference-build"
    return path if path.exists() else None


def recorded_build_flags() -> str | None:
    """The `CMAKE_ARGS=...` line scripts/setup wrote when it built llama-cpp-python."""
    path = build_flags_file()
    if path is None:
        return None
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    return next((line.strip() for line in lines if line.startswith("CMAKE_ARGS=")), None)


def cpu_count() -> int:
    """The cores this process may run on (its affinity, e.g. a replica pinned to a core set), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
