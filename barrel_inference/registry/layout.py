"""On-disk layout of the model cache and atomic file writes.

    <root>/blobs/sha256-<hex>.gguf        content-addressed, complete and verified only
    <root>/refs/<spec_hash>.ref           what a pull spec resolved to last time (JSON)
    <root>/tmp/<spec_hash>.part           a download in progress (resumable)
    <root>/manifests/<name>/<tag>.json    one per model name
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from .names import split_name


def spec_hash(spec: str) -> str:
    return hashlib.sha256(spec.encode()).hexdigest()[:32]


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def is_sha256(text: str | None) -> bool:
    return bool(text) and bool(_HEX64.match(bare_hex(text)))


def bare_hex(digest: str) -> str:
    """'sha256:abc' / 'sha256-abc' / 'abc' -> 'abc' (lower case)."""
    d = digest.strip().lower()
    for prefix in ("sha256:", "sha256-"):
        if d.startswith(prefix):
            d = d[len(prefix) :]
    return d


class CacheLayout:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.blobs = self.root / "blobs"
        self.refs = self.root / "refs"
        self.tmp = self.root / "tmp"
        self.manifests = self.root / "manifests"

    def ensure(self) -> None:
        for d in (self.blobs, self.refs, self.tmp, self.manifests):
            d.mkdir(parents=True, exist_ok=True)

    def blob_path(self, digest: str) -> Path:
        hexd = bare_hex(digest)
        if not _HEX64.match(hexd):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return self.blobs / f"sha256-{hexd}.gguf"

    def part_path(self, key: str) -> Path:
        return self.tmp / f"{spec_hash(key)}.part"

    def ref_path(self, key: str) -> Path:
        return self.refs / f"{spec_hash(key)}.ref"

    def manifest_path(self, name: str) -> Path:
        base, tag = split_name(name)
        return self.manifests.joinpath(*base.split("/")) / f"{tag}.json"

    def manifest_files(self) -> list[Path]:
        if not self.manifests.is_dir():
            return []
        return sorted(p for p in self.manifests.rglob("*.json") if p.is_file())

    def name_of(self, manifest_file: Path) -> str:
        rel = manifest_file.relative_to(self.manifests)
        return "/".join(rel.parent.parts) + ":" + rel.stem


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory, fsync, then rename over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
