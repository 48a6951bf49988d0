"""What a llama.cpp build is and sees: version, ggml's feature string, backend devices.

Reads them through the bindings the engine (the only module that imports llama_cpp) hands it:
`L` (llama_cpp) and a loader of ggml's ctypes library.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

DEV_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


def describe(L: Any, ggml_lib: Callable[[], Any]) -> dict:
    text = L.llama_print_system_info().decode("utf-8", "replace").strip()
    features: dict[str, str] = {}
    for part in text.replace("|", "\n").splitlines():
        key, sep, value = part.partition("=")
        if sep:
            features[key.strip().split(":")[-1].strip()] = value.strip()
    return {
        "llama_cpp_python": getattr(L, "__version__", None) or package_version(),
        "system_info": text,
        "features": features,
        "supports_gpu_offload": bool(L.llama_supports_gpu_offload()),
        "supports_mmap": bool(L.llama_supports_mmap()),
        "supports_mlock": bool(L.llama_supports_mlock()),
        "max_devices": int(L.llama_max_devices()),
        "devices": devices(ggml_lib),
    }


def package_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("llama_cpp_python")


def _typed(lib):
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
        getattr(lib, fn).restype = ctypes.c_char_p
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    lib.ggml_backend_dev_memory.restype = None
    return lib


def devices(ggml_lib: Callable[[], Any]) -> list[dict]:
    """ggml's backend devices (CPU, GPUs, accelerators) with their memory; [] where ggml hides them."""
    try:
        lib = _typed(ggml_lib())
    except (ImportError, OSError, AttributeError):
        return []
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append({
            "name": (lib.ggml_backend_dev_name(dev) or b"").decode("utf-8", "replace"),
            "description": (lib.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace"),
            "type": DEV_TYPES.get(lib.ggml_backend_dev_type(dev), "unknown"),
            "memory_free": free.value,
            "memory_total": total.value,
        })  # fmt: skip
    return out
