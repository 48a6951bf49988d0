"""Tiers of saved sequence state: RAM, then disk files that survive restarts.

An entry is the KV state of one sequence (bytes from llama_state_seq_get_data) together with the
exact tokens it holds. It is found by token prefix (tokens are compared, never trusted by hash),
so a restore can only reproduce what a recompute would. Entries live under a namespace: the model
file's fingerprint and the engine settings that shape the state; files of another namespace are
deleted at start (the model or the settings changed) and their sessions remembered as
`model-reloaded`.

RAM holds up to `ram_bytes`; the least recently useful entries move to disk (`disk_bytes`), the
oldest disk files are deleted. Entries pinned by their request (Submit.pin_ttl_s, until `pin_until`
on the store's clock) go last in both tiers, while their pin lasts. A file is written to a temporary name, synced and renamed, so a
crash never leaves a torn entry under a real name; a SHA-256 over tokens and state is checked on
every read and a file that fails it is deleted, never used.

Threads: the index is shared by the scheduler thread and one I/O thread under a lock held only for
bookkeeping; file reads, writes, hashing and deletes run on the I/O thread. Nothing here blocks the
scheduler on the disk: a disk hit is loaded asynchronously and reported through `on_loaded`.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import struct
import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .seqpool import common_prefix

MAGIC = b"BIKV1\n"
SUFFIX = ".kv"
_HDR = struct.Struct("<I")


@dataclass(eq=False)
class Entry:
    key: str
    tokens: array  # array("i")
    size: int  # bytes of state
    session: str | None = None
    template: str = ""
    data: bytes | bytearray | None = None  # in RAM when set
    on_disk: bool = False
    loading: bool = False
    last_used: int = 0
    pin_until: float = 0.0  # the store's clock time until which it goes after unpinned entries
    pos_min: int = -1  # the oldest position its window layers hold (-1: not known)

    @property
    def n(self) -> int:
        return len(self.tokens)


def model_fingerprint(path: str) -> str:
    """A model file's identity for the namespace: its size and its first and last MiB (a blob's
    name need not change when its contents do; hashing the whole file would slow every start)."""
    h = hashlib.sha256()
    try:
        st = os.stat(path)
        h.update(f"{st.st_size}".encode())
        with open(path, "rb") as f:
            h.update(f.read(1 << 20))
            f.seek(max(0, st.st_size - (1 << 20)))
            h.update(f.read(1 << 20))
    except OSError:
        h.update(path.encode())
    return h.hexdigest()[:32]


def namespace_id(namespace: dict) -> str:
    return hashlib.sha256(json.dumps(namespace, sort_keys=True).encode()).hexdigest()[:24]


def entry_key(ns: str, tokens) -> str:
    h = hashlib.sha256(ns.encode())
    h.update(array("i", tokens).tobytes())
    return h.hexdigest()[:32]


class KvStore:
    def __init__(self, *, namespace: dict, ram_bytes: int, disk_bytes: int = 0, directory: str | Path | None = None,
                 log=None, on_loaded: Callable[[Entry, bool], None] | None = None, template: str = "",
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.clock = clock  # the clock pins are given in (the sequence pool's)
        self.ns = namespace_id(namespace)
        self.namespace = namespace
        self.ram_bytes = max(0, ram_bytes)
        self.disk_bytes = max(0, disk_bytes) if directory else 0
        self.dir = Path(directory) if directory else None
        self.log = log or (lambda *a, **k: None)
        self.on_loaded = on_loaded or (lambda entry, ok: None)
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._clock = 0
        self.ram_used = 0
        self.disk_used = 0
        self.template = template  # the chat template in use (entries stay valid across templates: tokens decide)
        self.stale_sessions: dict[str, str] = {}  # session -> why its saved state is gone
        self.template_changed: dict[str, int] = {}  # session -> tokens it had saved under another template
        self.counts = {"saved": 0, "ram_evictions": 0, "disk_writes": 0, "disk_evictions": 0, "disk_loads": 0,
                       "corrupt": 0, "invalidated": 0}  # fmt: skip
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()
        if self.dir is not None and self.disk_bytes > 0:
            self._thread = threading.Thread(target=self._io_loop, name="kv-io", daemon=True)
            self._thread.start()
            self._jobs.put(("scan",))
        else:
            self.ready.set()

    @property
    def enabled(self) -> bool:
        return self.ram_bytes > 0

    # ---- the scheduler's side -----------------------------------------------------------
    def put(self, tokens, data, *, session: str | None = None, template: str = "", pin_until: float = 0.0,
            pos_min: int = -1) -> Entry | None:  # fmt: skip
        """Keep a saved state in RAM (it replaces an entry of the same tokens); pin_until: see the module doc."""
        size = len(data)
        if not self.enabled or not size or size > self.ram_bytes:
            return None
        toks = array("i", tokens)
        key = entry_key(self.ns, toks)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None and old.data is not None:
                self.ram_used -= old.size
            e = Entry(key, toks, size, session, template, data, on_disk=old is not None and old.on_disk, pos_min=pos_min)
            e.pin_until = max(pin_until, old.pin_until if old is not None else 0.0)
            self._touch(e)
            self._entries[key] = e
            self.ram_used += size
            self.counts["saved"] += 1
            self._spill_locked()
        return e

    def find(self, prompt, usable=None) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with prompt, and that length; usable(entry, n): only
        entries that can be continued at their shared length n count."""
        best, best_n, _ = self.match(prompt, usable)
        return best, best_n

    def match(self, prompt, usable=None) -> tuple[Entry | None, int, int]:
        """find's entry and length, and the longest prefix any entry shares with prompt (usable
        or not), in one pass over the entries."""
        best, best_n, shared = None, 0, 0
        with self._lock:
            entries = list(self._entries.values())
        if not entries:
            return None, 0, 0
        prompt = prompt if isinstance(prompt, array) else array("i", prompt)
        for e in entries:
            n = common_prefix(e.tokens, prompt)
            shared = max(shared, n)
            if usable is not None and n > 0 and not usable(e, n):
                continue
            if n > best_n or (n == best_n and best is not None and n and e.data is not None and best.data is None):
                best, best_n = e, n
        return best, best_n, shared

    def take(self, e: Entry) -> bytes | bytearray | None:
        """The state of an entry that is in RAM (marked used), else None."""
        with self._lock:
            if e.data is None or self._entries.get(e.key) is not e:
                return None
            self._touch(e)
            return e.data

    def pin(self, e: Entry, until: float) -> None:
        """Keep an entry's pin at least until `until`."""
        with self._lock:
            e.pin_until = max(e.pin_until, until)

    def _evict_order(self, e: Entry) -> tuple[bool, int]:
        """Sort key of eviction: unpinned entries first, then by recency."""
        return e.pin_until > self.clock(), e.last_used

    def load(self, e: Entry) -> bool:
        """Start reading a disk entry into RAM; on_loaded(entry, ok) follows on the I/O thread."""
        with self._lock:
            if e.loading or not e.on_disk or self._thread is None:
                return False
            e.loading = True
        self._jobs.put(("load", e))
        return True

    def drop(self, e: Entry) -> None:
        with self._lock:
            self._remove_locked(e)

    def stats(self) -> dict:
        with self._lock:
            n_ram = sum(1 for e in self._entries.values() if e.data is not None)
            n_disk = sum(1 for e in self._entries.values() if e.on_disk)
            return {
                "ram_bytes": self.ram_used, "ram_entries": n_ram, "ram_limit": self.ram_bytes,
                "disk_bytes": self.disk_used, "disk_entries": n_disk, "disk_limit": self.disk_bytes,
                "namespace": self.ns, **self.counts,
            }  # fmt: skip

    def persist(self) -> None:
        """Queue every RAM entry that has no file yet for writing (at shutdown: saved states
        survive the restart)."""
        with self._lock:
            if self._thread is None:
                return
            for e in sorted(self._entries.values(), key=lambda e: -e.last_used):
                if e.data is not None and not e.on_disk and e.size <= self.disk_bytes:
                    self._jobs.put(("write", e, e.data))

    def close(self, timeout: float = 30.0) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until queued disk work is done (tests, shutdown)."""
        if self._thread is None:
            return
        done = threading.Event()
        self._jobs.put(("mark", done))
        done.wait(timeout)

    # ---- bookkeeping (lock held) --------------------------------------------------------
    def _touch(self, e: Entry) -> None:
        self._clock += 1
        e.last_used = self._clock

    def _spill_locked(self) -> None:
        """RAM over its budget: the least recently used entries go to disk (or away)."""
        if self.ram_used <= self.ram_bytes:
            return
        for e in sorted((e for e in self._entries.values() if e.data is not None), key=self._evict_order):
            if self.ram_used <= self.ram_bytes:
                break
            data, e.data = e.data, None
            self.ram_used -= e.size
            self.counts["ram_evictions"] += 1
            if e.on_disk:
                continue
            if self._thread is not None and e.size <= self.disk_bytes:
                self._jobs.put(("write", e, data))
            else:
                self._entries.pop(e.key, None)

    def _remove_locked(self, e: Entry) -> None:
        if self._entries.get(e.key) is e:
            del self._entries[e.key]
        if e.data is not None:
            self.ram_used -= e.size
            e.data = None
        if e.on_disk:
            e.on_disk = False
            self.disk_used -= e.size
            self._jobs.put(("delete", e.key))

    # ---- the I/O thread -----------------------------------------------------------------
    def _io_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                getattr(self, "_io_" + job[0])(*job[1:])
            except Exception as exc:  # an I/O failure costs a cache entry, never the worker
                self.log("kv_io_error", job=job[0], error=repr(exc))

    def _io_mark(self, event: threading.Event) -> None:
        event.set()

    def _path(self, key: str) -> Path:
        assert self.dir is not None
        return self.dir / (key + SUFFIX)

    def _io_scan(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            for p in self.dir.iterdir():
                if p.name.endswith(".tmp"):
                    p.unlink(missing_ok=True)  # a write that never finished
                    continue
                if not p.name.endswith(SUFFIX):
                    continue
                try:
                    hdr, toks = _read_header(p)
                except (OSError, ValueError):
                    self.counts["corrupt"] += 1
                    p.unlink(missing_ok=True)
                    continue
                if hdr.get("ns") != self.ns:
                    self.counts["invalidated"] += 1
                    if hdr.get("session"):
                        self.stale_sessions[hdr["session"]] = "model-reloaded"
                    p.unlink(missing_ok=True)
                    continue
                key = p.name[: -len(SUFFIX)]
                e = Entry(key, toks, int(hdr["size"]), hdr.get("session"), hdr.get("template", ""), on_disk=True,
                          pos_min=int(hdr.get("pos_min", -1)))  # fmt: skip
                if e.session and e.template != self.template:
                    self.template_changed[e.session] = max(e.n, self.template_changed.get(e.session, 0))
                e.last_used = int(p.stat().st_mtime_ns // 1000)  # older files first out
                with self._lock:
                    if key not in self._entries:
                        self._entries[key] = e
                        self.disk_used += e.size
            with self._lock:
                self._clock = max([self._clock] + [e.last_used for e in self._entries.values()])
            self._io_trim()
        finally:
            self.ready.set()

    def _io_write(self, e: Entry, data) -> None:
        with self._lock:
            if self._entries.get(e.key) is not e:
                return  # replaced or dropped meanwhile
        path = self._path(e.key)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        hdr = {"ns": self.ns, "n": e.n, "size": e.size, "session": e.session, "template": e.template,
               "pos_min": e.pos_min, "sha256": _digest(e.tokens, data)}  # fmt: skip
        raw = json.dumps(hdr).encode()
        with open(tmp, "wb") as f:
            f.write(MAGIC + _HDR.pack(len(raw)) + raw)
            f.write(e.tokens.tobytes())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        with self._lock:
            if self._entries.get(e.key) is e and not e.on_disk:
                e.on_disk = True
                self.disk_used += e.size
                self.counts["disk_writes"] += 1
            elif self._entries.get(e.key) is not e:
                path.unlink(missing_ok=True)
        self._io_trim()

    def _io_trim(self) -> None:
        with self._lock:
            victims = []
            if self.disk_used > self.disk_bytes:
                for e in sorted((e for e in self._entries.values() if e.on_disk and not e.loading), key=self._evict_order):
                    if self.disk_used <= self.disk_bytes:
                        break
                    e.on_disk = False
                    self.disk_used -= e.size
                    self.counts["disk_evictions"] += 1
                    if e.data is None:
                        self._entries.pop(e.key, None)
                        if e.session:
                            self.stale_sessions[e.session] = "evicted"
                    victims.append(e.key)
        for key in victims:
            self._path(key).unlink(missing_ok=True)

    def _io_delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def _io_load(self, e: Entry) -> None:
        data = None
        try:
            data = _read_entry(self._path(e.key), self.ns, e.tokens)
        except (OSError, ValueError) as exc:
            self.log("kv_entry_rejected", key=e.key, error=str(exc))
        with self._lock:
            e.loading = False
            if data is None:
                self.counts["corrupt"] += 1
                self._remove_locked(e)
            elif self._entries.get(e.key) is e:
                if e.data is None:
                    e.data = data
                    self.ram_used += e.size
                self.counts["disk_loads"] += 1
                self._touch(e)
                self._spill_locked()
        self.on_loaded(e, data is not None)


def _digest(tokens: array, data) -> str:
    h = hashlib.sha256(tokens.tobytes())
    h.update(data)
    return h.hexdigest()


def _read_header(path: Path) -> tuple[dict, array]:
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a saved state")
        (n,) = _HDR.unpack(f.read(_HDR.size))
        if n > 1 << 20:
            raise ValueError("header too long")
        hdr = json.loads(f.read(n))
        raw = f.read(4 * int(hdr["n"]))
    toks = array("i")
    toks.frombytes(raw)
    if len(toks) != int(hdr["n"]):
        raise ValueError("truncated tokens")
    return hdr, toks


def _read_entry(path: Path, ns: str, tokens: array) -> bytes:
    with open(path, "rb") as f:
        blob = f.read()
    if not blob.startswith(MAGIC):
        raise ValueError("not a saved state")
    off = len(MAGIC)
    (n,) = _HDR.unpack_from(blob, off)
    off += _HDR.size
    hdr = json.loads(blob[off : off + n])
    off += n
    ntok = int(hdr["n"])
    toks = array("i")
    toks.frombytes(blob[off : off + 4 * ntok])
    off += 4 * ntok
    data = blob[off:]
    if hdr.get("ns") != ns or toks != tokens:
        raise ValueError("entry of another model, settings or prefix")
    if len(data) != int(hdr["size"]) or _digest(toks, data) != hdr.get("sha256"):
        raise ValueError("checksum mismatch: torn or corrupt entry")
    return data
