"""One runtime dir per daemon: a lock file held for the gateway's life.

Worker sockets live in the runtime dir; two daemons sharing one would reach each other's workers.
The default dir carries the port (config.Settings.run_dir); an operator's explicit `runtime_dir` is
used as given, and this lock turns a second daemon on the same dir into a clear error at start.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "gateway.lock"


class RuntimeDirBusy(RuntimeError):
    pass


class RuntimeLock:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> "RuntimeLock":
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise RuntimeDirBusy(
                f"another barrel-inference daemon (pid {holder}) uses the runtime dir {self.path.parent}; "
                "give this one another port or runtime_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None

    def __enter__(self) -> "RuntimeLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
