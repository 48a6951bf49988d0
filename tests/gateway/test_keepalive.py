"""keep_alive values as Ollama accepts them: Go durations, seconds, 0, negative = forever."""

from __future__ import annotations

import math

import pytest

from barrel_inference.gateway.keepalive import FOREVER, KeepAliveError, format_keep_alive, parse_keep_alive


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("5m", 300.0), ("1h30m", 5400.0), ("300ms", 0.3), ("1.5h", 5400.0), ("2h45m30.5s", 9930.5), ("10us", 1e-5),
        ("0", 0.0), ("0s", 0.0), ("300", 300.0), ("2.5", 2.5), (0, 0.0), (30, 30.0), (1.5, 1.5),
        (-1, FOREVER), ("-1", FOREVER), ("-5m", FOREVER), (-0.5, FOREVER), (None, 42.0),
    ],
)  # fmt: skip
def test_parse_keep_alive(value, seconds):
    assert parse_keep_alive(value, 42.0) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "5 minutes", "m5", "5x", "1h 30m", "abc", True, [1], {"s": 1}, math.nan])
def test_parse_keep_alive_rejects(value):
    with pytest.raises(KeepAliveError):
        parse_keep_alive(value, 300.0)


def test_format_keep_alive():
    assert format_keep_alive(300) == "5m0s"
    assert format_keep_alive(5400) == "1h30m0s"
    assert format_keep_alive(0.3) == "0.3s"
    assert format_keep_alive(FOREVER) == "forever"
