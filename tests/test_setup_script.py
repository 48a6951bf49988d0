"""scripts/setup's llama-cpp-python build: keyed by CMAKE_ARGS (and version, CPU), rebuilt when they
change, a cached wheel reused when going back. Run against a stub venv python that records pip calls."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

STUB = """#!/usr/bin/env bash
echo "CMAKE_ARGS=${CMAKE_ARGS-} ARGS=$*" >> "$STUB_LOG"
if [ "$1" = "-c" ]; then exec python3 "$@"; fi
if [ "$1 $2 $3" = "-m pip wheel" ]; then
  while [ $# -gt 0 ]; do if [ "$1" = "-w" ]; then out=$2; fi; shift; done
  touch "$out/llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"
fi
exit 0
"""


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup", root / "scripts" / "setup")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    stub = root / ".venv" / "bin" / "python"
    stub.parent.mkdir(parents=True)
    stub.write_text(STUB)
    stub.chmod(0o755)
    return root


def setup(root: Path, tmp: Path, cmake_args: str | None) -> list[str]:
    log = tmp / "pip.log"
    log.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "CMAKE_ARGS"}
    env.update(STUB_LOG=str(log), BARREL_INFERENCE_WHEEL_CACHE=str(tmp / "wheels"), PYTHON=shutil.which("python3"))
    if cmake_args is not None:
        env["CMAKE_ARGS"] = cmake_args
    r = subprocess.run(["bash", str(root / "scripts" / "setup")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return log.read_text().splitlines()


def built(calls):
    return [c for c in calls if "pip wheel" in c]


def installed(calls):
    return [c for c in calls if "--force-reinstall" in c]


def test_build_is_keyed_by_cmake_args(tree, tmp_path):
    stamp = tree / ".venv" / ".barrel-inference-build"
    first = setup(tree, tmp_path, None)
    assert len(built(first)) == 1 and built(first)[0].startswith("CMAKE_ARGS= ") and len(installed(first)) == 1
    assert "--no-binary llama-cpp-python" in built(first)[0] and "llama-cpp-python==" in built(first)[0]
    assert stamp.read_text().splitlines()[1].startswith("CMAKE_ARGS=(none")
    assert any("pip install -q -e .[test]" in c for c in first)

    again = setup(tree, tmp_path, None)  # nothing changed: no rebuild, no reinstall
    assert built(again) == [] and installed(again) == []

    cuda = setup(tree, tmp_path, "-DGGML_CUDA=on")  # new flags: a new build, recorded for doctor
    assert len(built(cuda)) == 1 and built(cuda)[0].startswith("CMAKE_ARGS=-DGGML_CUDA=on ")
    assert len(installed(cuda)) == 1 and stamp.read_text().splitlines()[1] == "CMAKE_ARGS=-DGGML_CUDA=on"

    back = setup(tree, tmp_path, "")  # back to the default: the kept wheel, no rebuild
    assert built(back) == [] and len(installed(back)) == 1
    assert stamp.read_text().splitlines()[1].startswith("CMAKE_ARGS=(none")


def test_no_deps_installs_the_package_alone_and_a_later_run_installs_the_rest(tree, tmp_path, monkeypatch):
    # an offline machine whose dependencies are already in .venv: the package itself, nothing resolved
    monkeypatch.setenv("BARREL_INFERENCE_NO_DEPS", "1")
    offline = setup(tree, tmp_path, "-DGGML_CUDA=on")
    pkg = [c for c in offline if "pip install -q" in c and " -e " in c]
    assert len(pkg) == 1 and pkg[0].endswith("pip install -q --no-deps -e .")
    assert len(built(offline)) == 1  # llama-cpp-python is still built from source for these flags
    again = setup(tree, tmp_path, "-DGGML_CUDA=on")  # nothing changed: nothing installed
    assert [c for c in again if "-m pip" in c] == []

    monkeypatch.delenv("BARREL_INFERENCE_NO_DEPS")
    online = setup(tree, tmp_path, "-DGGML_CUDA=on")  # the default again: dependencies and test extras
    assert any(c.endswith("pip install -q -e .[test]") for c in online) and built(online) == []
