"""The gateway's logger follows the settings: JSON or console lines, and the level."""

from __future__ import annotations

import io
import json

from barrel_inference.config import Settings
from barrel_inference.gateway.logging import make_logger


def test_json_lines_and_level():
    out = io.StringIO()
    log = make_logger(Settings(log_json=True, log_level="warning"), stream=out)
    log.info("hidden", a=1)
    log.warning("shown", request_id="r1", total_ms=2.5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert (rec["event"], rec["level"], rec["request_id"], rec["total_ms"]) == ("shown", "warning", "r1", 2.5)
    assert rec["timestamp"].endswith("Z")


def test_console_lines():
    out = io.StringIO()
    make_logger(Settings(log_json=False, log_level="debug"), stream=out).debug("request", model="m")
    line = out.getvalue().strip()
    assert "request" in line and "model=m" in line and not line.startswith("{")
