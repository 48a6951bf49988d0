"""Repack the llama-cpp-python sdist without what no build reads, so that it travels light.

    python -m bench.slim_sdist IN.tar.gz OUT.tar.gz

The sdist (~75 MB) carries llama.cpp's whole tree: tokenizer test vocabularies (models/), docs,
benchmark results, test media, a git directory and every ggml backend. A build of the Python
package (CPU or CUDA) and of llama-server compiles none of them, so they are left out; the version,
the build files and every source that a CPU, CUDA or BLAS build compiles stay, under the same top
directory, so pip builds the result as it would the original. `SLIM_README` records what was
dropped and the original's sha256 inside the archive.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import tarfile
import time
from pathlib import Path

# paths relative to the sdist's top directory; a directory drops everything under it
DROP = (
    ".git", ".github", "docker", "docs", "examples", "tests",
    "vendor/llama.cpp/models", "vendor/llama.cpp/docs", "vendor/llama.cpp/media", "vendor/llama.cpp/benches",
    "vendor/llama.cpp/tests", "vendor/llama.cpp/examples", "vendor/llama.cpp/pocs", "vendor/llama.cpp/gguf-py",
    "vendor/llama.cpp/conversion", "vendor/llama.cpp/ci", "vendor/llama.cpp/skills", "vendor/llama.cpp/requirements",
    "vendor/llama.cpp/tools/ui/src", "vendor/llama.cpp/tools/ui/tests", "vendor/llama.cpp/tools/ui/static",
    "vendor/llama.cpp/tools/ui/package-lock.json", "vendor/llama.cpp/tools/server/tests",
    "vendor/llama.cpp/tools/server/bench", "vendor/llama.cpp/tools/mtmd/tests", "vendor/llama.cpp/tools/mtmd/test-3.mp4",
    *(f"vendor/llama.cpp/ggml/src/ggml-{b}" for b in (
        "cann", "et", "hexagon", "metal", "musa", "hip", "opencl", "openvino", "sycl", "virtgpu", "vulkan",
        "webgpu", "zdnn", "zendnn",
    )),
)  # fmt: skip


def dropped(rel: str) -> bool:
    return any(rel == d or rel.startswith(d + "/") for d in DROP)


def slim(src: Path, dst: Path) -> dict:
    """Write dst from src without the DROP paths; return counts and sizes."""
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    kept = skipped = 0
    top = None
    with tarfile.open(src) as tin, tarfile.open(dst, "w:gz", compresslevel=9) as tout:
        for m in tin:
            head, _, rel = m.name.partition("/")
            top = top or head
            if rel and dropped(rel):
                skipped += 1
                continue
            tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
            kept += 1
        note = (f"Repacked from {src.name} (sha256 {digest}) by bench/slim_sdist.py.\n"
                "Left out (not read by any build):\n" + "".join(f"  {d}\n" for d in DROP)).encode()  # fmt: skip
        info = tarfile.TarInfo(f"{top}/SLIM_README")
        info.size, info.mtime, info.mode = len(note), int(time.time()), 0o644
        tout.addfile(info, io.BytesIO(note))
    return {"source": src.name, "source_sha256": digest, "source_bytes": src.stat().st_size,
            "bytes": dst.stat().st_size, "members_kept": kept, "members_dropped": skipped}  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.slim_sdist", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    a = p.parse_args(argv)
    if a.src.resolve() == a.dst.resolve():
        p.error("write the slim sdist to another path")
    facts = slim(a.src, a.dst)
    print(facts, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
