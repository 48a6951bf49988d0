"""Process facts from /proc: descendants of a server and their peak resident memory (VmHWM)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def _stat_fields():
    """(pid, the fields of /proc/<pid>/stat after the command name) for every live process.

    Field 4 of stat (ppid) is the second item; utime and stime (fields 14, 15) are items 11 and 12.
    """
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        yield int(d.name), stat[stat.rfind(")") + 2 :].split()


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for pid, rest in _stat_fields():
        kids.setdefault(int(rest[1]), []).append(pid)
    return kids


def process_tree(pid: int) -> list[int]:
    """pid and all its live descendants."""
    kids = _children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def status_fields(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _kib(value: str | None) -> int:
    if not value:
        return 0
    return int(value.strip().split()[0])


def peak_rss(pid: int) -> list[dict]:
    """VmHWM and VmRSS (MiB) of the server process and each descendant, while they are alive."""
    rows = []
    for p in process_tree(pid):
        st = status_fields(p)
        if not st:
            continue
        rows.append({
            "pid": p,
            "name": st.get("Name", "").strip(),
            "cmd": cmdline(p)[:800],
            "peak_rss_mib": _kib(st.get("VmHWM")) / 1024.0,
            "rss_mib": _kib(st.get("VmRSS")) / 1024.0,
        })  # fmt: skip
    return rows


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def busy_processes(min_cpu_pct: float = 20.0, exclude: set[int] | None = None, sample_s: float = 1.0) -> list[str]:
    """Processes (not ours) using at least min_cpu_pct of a core over sample_s: who else loads the machine."""
    import time

    exclude = exclude or set()
    hz = os.sysconf("SC_CLK_TCK")

    def ticks() -> dict[int, int]:
        return {pid: int(rest[11]) + int(rest[12]) for pid, rest in _stat_fields()}

    a = ticks()
    time.sleep(sample_s)
    b = ticks()
    busy = []
    for pid, t in b.items():
        if pid in exclude or pid not in a:
            continue
        pct = 100.0 * (t - a[pid]) / hz / sample_s
        if pct >= min_cpu_pct:
            busy.append(f"{pct:.0f}% {cmdline(pid)[:100]}")
    return busy


def cpu_seconds(pids) -> dict[int, float]:
    """user+system CPU seconds of each live pid."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for p in pids:
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        out[p] = (int(rest[11]) + int(rest[12])) / hz
    return out


def machine_busy_seconds() -> float:
    """CPU seconds all processes have used since boot (user+nice+system+irq+softirq+steal of /proc/stat)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return 0.0
    v = [int(x) for x in first[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def stop_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM a daemon started with start_new_session=True; SIGKILL its whole group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
