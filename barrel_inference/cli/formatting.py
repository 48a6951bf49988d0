"""Human-readable sizes, ages, tables and the pull progress bar."""

from __future__ import annotations

import datetime as dt
import shutil
import sys
import time

import click


def human_size(n: int | float | None) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}" if n < 10 else f"{n:.0f} {unit}"
        n /= 1000
    return f"{n:.0f} TB"  # pragma: no cover


def _utc(when: str) -> dt.datetime | None:
    """An RFC 3339 / ISO time (a "Z" suffix allowed; no zone: UTC), None when it does not parse."""
    try:
        t = dt.datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.timezone.utc)


def ago(when: str | None, now: dt.datetime | None = None) -> str:
    if not when:
        return "?"
    t = _utc(when)
    if t is None:
        return when
    now = now or dt.datetime.now(dt.timezone.utc)
    s = (now - t).total_seconds()
    if s < 0:
        return "just now"
    for limit, div, unit in ((60, 1, "second"), (3600, 60, "minute"), (86400, 3600, "hour"), (86400 * 30, 86400, "day"),
                             (86400 * 365, 86400 * 30, "month"), (float("inf"), 86400 * 365, "year")):  # fmt: skip
        if s < limit:
            n = int(s // div)
            if unit == "second" and n < 5:
                return "just now"
            return f"{n} {unit}{'s' if n != 1 else ''} ago"
    return when  # pragma: no cover


def duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "--:--"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)] if rows else [len(h) for h in headers]
    lines = ["   ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in [headers, *rows]]
    return "\n".join(lines)


class PullProgress:
    """Draws Ollama-style pull events: phase lines, and a bar with bytes, speed and ETA while a layer downloads."""

    def __init__(self, stream=None, *, interactive: bool | None = None, clock=time.monotonic):
        self.stream = stream or sys.stderr
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self.clock = clock
        self.current: str | None = None
        self.samples: list[tuple[float, int]] = []
        self.last_line = ""
        self.last_draw = 0.0

    def speed(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else None

    def bar_line(self, status: str, completed: int, total: int | None) -> str:
        speed = self.speed()
        if total:
            frac = min(1.0, completed / total)
            width = max(10, min(40, shutil.get_terminal_size((100, 20)).columns - 70))
            filled = int(frac * width)
            eta = (total - completed) / speed if speed else None
            return (f"{status} {frac * 100:3.0f}% ▕{'█' * filled}{' ' * (width - filled)}▏ {human_size(completed)}/{human_size(total)}"
                    f"  {human_size(speed) + '/s' if speed else '-- B/s'}  ETA {duration(eta)}")  # fmt: skip
        return f"{status} {human_size(completed)}  {human_size(speed) + '/s' if speed else '-- B/s'}"

    def _emit(self, line: str, *, final: bool) -> None:
        if self.interactive:
            pad = max(0, len(self.last_line) - len(line))
            self.stream.write(("\r" if self.last_line else "") + line + " " * pad + ("\n" if final else ""))
            self.last_line = "" if final else line
        elif final:
            self.stream.write(line + "\n")
        self.stream.flush()

    def update(self, event: dict) -> None:
        status = event.get("status", "")
        if "completed" in event or "total" in event:
            now = self.clock()
            if status != self.current:
                self.finish_layer()
                self.current = status
                self.samples = []
            completed = int(event.get("completed") or 0)
            self.samples.append((now, completed))
            self.samples = [s for s in self.samples if now - s[0] <= 5.0] or self.samples[-1:]
            line = self.bar_line(status, completed, event.get("total"))
            self.pending = line
            if self.interactive and (now - self.last_draw >= 0.1 or completed == event.get("total")):
                self.last_draw = now
                self._emit(line, final=False)
            return
        self.finish_layer()
        self._emit(status, final=True)

    def finish_layer(self) -> None:
        if self.current is not None:
            self._emit(getattr(self, "pending", self.current), final=True)
            self.current = None


def echo_json(data) -> None:
    import json

    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def processor(size: int | None, size_vram: int | None) -> str:
    """Ollama's PROCESSOR column: where the model's bytes live (100% CPU, 100% GPU or a CPU/GPU split)."""
    if not size:
        return "?"
    gpu = max(0, min(100, round(100 * (size_vram or 0) / size)))
    if gpu == 0:
        return "100% CPU"
    if gpu == 100:
        return "100% GPU"
    return f"{100 - gpu}%/{gpu}% CPU/GPU"


def until(expires_at: str | None, now: dt.datetime | None = None) -> str:
    """Ollama's UNTIL column: when an idle model unloads ('Forever' for a model that stays)."""
    if not expires_at:
        return "?"
    t = _utc(expires_at)
    if t is None:
        return expires_at
    now = now or dt.datetime.now(dt.timezone.utc)
    s = (t - now).total_seconds()
    if s > 100 * 365 * 86400:
        return "Forever"
    if s <= 0:
        return "Stopping..."
    for limit, div, unit in ((60, 1, "second"), (3600, 60, "minute"), (86400, 3600, "hour"), (float("inf"), 86400, "day")):
        if s < limit:
            n = max(1, int(s // div))
            return f"{n} {unit}{'s' if n != 1 else ''} from now"
    return expires_at  # pragma: no cover
