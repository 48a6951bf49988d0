"""keep_alive values: how long a model stays loaded after a request.

Accepted as Ollama accepts them: a Go duration string ("5m", "1h30m", "300ms", "1.5h", "-1m"), a number
of seconds (int or float, also as a string: "300"), 0 (unload after this request) or a negative value (keep
loaded forever). `parse_keep_alive` returns seconds as a float, `FOREVER` (inf) for negative values.
"""

from __future__ import annotations

import math
import re

FOREVER = math.inf

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_NUMBER = re.compile(r"^[+-]?(\d+(?:\.\d*)?|\.\d+)$")


class KeepAliveError(ValueError):
    """A keep_alive value that is neither a duration nor a number."""


def parse_duration(text: str) -> float:
    """A Go `time.ParseDuration` string in seconds: '1h30m' -> 5400.0, '-5m' -> -300.0, '0' -> 0.0."""
    s = text.strip()
    if not s:
        raise KeepAliveError("an empty duration")
    sign = 1.0
    if s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    total, pos = 0.0, 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise KeepAliveError(
                f"{text!r} is not a duration (use a number of seconds or a duration such as '5m', '1h30m', '300ms')"
            )
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def parse_keep_alive(value: object, default: float) -> float:
    """Seconds to keep the model loaded after the request; `default` when value is None; FOREVER when negative."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise KeepAliveError(f"keep_alive must be a duration or a number of seconds, not {str(value).lower()}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = float(value) if _NUMBER.match(value.strip()) else parse_duration(value)
    else:
        raise KeepAliveError(f"keep_alive must be a duration or a number of seconds, not {type(value).__name__}")
    if math.isnan(seconds):
        raise KeepAliveError("keep_alive must be a number, not NaN")
    return FOREVER if seconds < 0 else seconds


def format_keep_alive(seconds: float) -> str:
    """For logs and config echoes: 300 -> '5m0s', inf -> 'forever'."""
    if seconds == FOREVER:
        return "forever"
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    frac = seconds - whole
    out = (f"{h}h" if h else "") + (f"{m}m" if h or m else "")
    return out + (f"{s + frac:g}s" if frac else f"{s}s")
