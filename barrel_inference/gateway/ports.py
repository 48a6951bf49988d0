"""Is the listening port free, and if not, which process holds it (from /proc where it can be read)."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path


class PortInUse(Exception):
    """The bind address is taken; `message` is the one line a person reads."""

    def __init__(self, host: str, port: int, pid: int | None, command: str | None = None) -> None:
        self.host, self.port, self.pid, self.command = host, port, pid, command
        holder = f" by pid {pid}" + (f" ({command})" if command else "") if pid else ""
        self.message = f"port {port} is in use{holder}; use --port or stop it"
        super().__init__(self.message)


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def holder_of(port: int) -> tuple[int | None, str | None]:
    """(pid, command) of a process listening on `port`, where /proc shows it; else (None, None)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None, None
    targets = {f"socket:[{i}]" for i in inodes}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in targets:
                    try:
                        cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    except OSError:
                        cmd = None
                    return int(entry.name), (cmd[:80] if cmd else None)
            except OSError:
                continue
    return None, None


def check_free(host: str, port: int) -> None:
    """Raise PortInUse when `host:port` cannot be bound because something listens there."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(host, port, *holder_of(port)) from None
            raise
