"""Remembered engine fallbacks: a model that crashed its worker in the default engine profile.

Keyed by the model's digest, the llama.cpp build and the CPU signature (hostinfo): the same model
on the same build and CPU goes straight to the safe profile on the next start, while a rebuild
(other CMAKE_ARGS, a new llama-cpp-python) or another CPU tries the default profile again.
Kept as one JSON file under the model cache dir, replaced atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..hostinfo import cpu_signature, llama_build_id

FILE_NAME = "engine-fallbacks.json"


class FallbackStore:
    def __init__(self, path: Path, *, build_id: str | None = None, cpu: str | None = None) -> None:
        self.path = Path(path)
        self.build_id = build_id if build_id is not None else llama_build_id()
        self.cpu = cpu if cpu is not None else cpu_signature()
        self._lock = threading.Lock()

    @classmethod
    def in_cache_dir(cls, cache_dir: Path, **kw: Any) -> "FallbackStore":
        return cls(Path(cache_dir) / FILE_NAME, **kw)

    def key(self, record: Any) -> str:
        digest = getattr(record, "digest", None) or f"path:{getattr(record, 'path', '')}"
        return f"{digest}|{self.build_id}|{self.cpu}"

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, record: Any) -> dict | None:
        entry = self._read().get(self.key(record))
        return entry if isinstance(entry, dict) else None

    def remember(self, record: Any, *, profile: str, reason: str, signal: str | None = None) -> dict:
        entry = {
            "model": getattr(record, "name", ""), "digest": getattr(record, "digest", None), "build": self.build_id,
            "cpu": self.cpu, "profile": profile, "signal": signal, "reason": reason, "at": round(time.time(), 3),
        }  # fmt: skip
        with self._lock:
            data = self._read()
            data[self.key(record)] = entry
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".fallbacks-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return entry

    def entries(self) -> list[dict]:
        """Every remembered fallback, marked `applies` where it is for this build and CPU."""
        out = []
        for entry in self._read().values():
            if isinstance(entry, dict):
                out.append({**entry, "applies": entry.get("build") == self.build_id and entry.get("cpu") == self.cpu})
        return sorted(out, key=lambda e: e.get("at") or 0)
