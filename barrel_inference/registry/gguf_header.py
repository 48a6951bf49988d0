"""A fast reader of a GGUF file's metadata and tensor infos (the header only; tensor data is never touched).

The gguf package's GGUFReader builds numpy views for every array item, which takes ~10 s on a 262k-token
vocabulary; this reader skips arrays by length and keeps only scalars and strings. It falls back to GGUFReader
for files it does not understand (big-endian, GGUF v1).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from .errors import RegistryError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str):
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        raw = self.buf[self.pos : self.pos + n]
        if len(raw) != n:
            raise ValueError("truncated string")
        self.pos += n
        return bytes(raw).decode("utf-8", "replace")

    def skip_string(self) -> None:
        n = self.unpack("<Q")
        self.pos += n

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if etype in _SCALARS:
                self.pos += struct.calcsize(_SCALARS[etype]) * count
            elif etype == _STRING:
                for _ in range(count):
                    self.skip_string()
            else:
                for _ in range(count):
                    self.value(etype)
            return {"array_length": count}
        raise ValueError(f"unknown GGUF value type {vtype}")


def read_header(path: Path) -> tuple[dict, int]:
    """(metadata with arrays reported as {'array_length': n}, total parameter count)."""
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != b"GGUF":
                raise RegistryError("not_gguf", f"{path} is not a GGUF file (bad magic bytes)", path=str(path))
            c = _Cursor(buf)
            c.pos = 4
            version = c.unpack("<I")
            if version not in (2, 3):
                return _fallback(path)
            n_tensors = c.unpack("<Q")
            n_kv = c.unpack("<Q")
            meta: dict = {}
            for _ in range(n_kv):
                key = c.string()
                meta[key] = c.value(c.unpack("<I"))
            n_params = 0
            for _ in range(n_tensors):
                c.skip_string()
                n_dims = c.unpack("<I")
                count = 1
                for _ in range(n_dims):
                    count *= c.unpack("<Q")
                c.pos += 4 + 8  # type, offset
                n_params += count
            return meta, n_params
    except RegistryError:
        raise
    except (struct.error, ValueError, OSError) as exc:
        raise RegistryError("bad_gguf", f"{path} is not a readable GGUF file ({exc})", path=str(path)) from exc


def _fallback(path: Path) -> tuple[dict, int]:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as exc:
        raise RegistryError("bad_gguf", f"{path} is not a readable GGUF file ({exc})", path=str(path)) from exc
    meta: dict = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
            meta[name] = {"array_length": len(field.data)}
        else:
            meta[name] = field.contents()
    return meta, int(sum(int(t.n_elements) for t in reader.tensors))
