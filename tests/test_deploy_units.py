"""deploy/'s systemd units: hardened as documented, and clean under `systemd-analyze verify` where it exists."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
UNITS = ["barrel-inference.service", "barrel-inference-worker@.service"]
HARDENING = {
    "NoNewPrivileges": "true", "ProtectSystem": "strict", "ProtectHome": "true", "PrivateTmp": "true",
    "ReadWritePaths": "/var/cache/barrel-inference", "Restart": "on-failure", "CapabilityBoundingSet": "",
}  # fmt: skip


def service_section(name: str) -> dict[str, str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str
    parser.read_string((DEPLOY / name).read_text())
    return dict(parser["Service"])


@pytest.mark.parametrize("name", UNITS)
def test_units_are_hardened(name):
    service = service_section(name)
    for key, value in HARDENING.items():
        assert service.get(key) == value, key
    assert service["User"] == "barrel-inference" and service["KillSignal"] == "SIGTERM"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_units_verify_cleanly(tmp_path):
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    for exe in ("bictl", "python"):
        (bindir / exe).write_text("#!/bin/sh\nexit 0\n")
        (bindir / exe).chmod(0o755)
    for name in UNITS:
        text = (DEPLOY / name).read_text().replace("/opt/barrel-inference/.venv/bin/", f"{bindir}/")
        (tmp_path / name).write_text(text)
    instance = tmp_path / "barrel-inference-worker@gpu0.service"
    instance.write_text((tmp_path / "barrel-inference-worker@.service").read_text())
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / UNITS[0]), str(instance)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and r.stderr.strip() == "" and r.stdout.strip() == "", r.stderr + r.stdout
