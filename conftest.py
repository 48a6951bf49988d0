"""Suite-wide policy, for every test directory: in CI, a skipped test fails unless it opted out.

A test that skips because something is missing (the `bictl` entry point, a client library, the packaged
model) proves nothing, and a green run would hide that. With the environment variable CI set (as CI
services do), such a skip is reported as a failure. A test that cannot run on some machines by nature
(e.g. a browser that cannot be installed there) opts out with `@pytest.mark.may_skip(reason=...)`.
Deselection (`-m "not gemma"`) and expected failures (xfail) are not skips and are left alone.
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]  # tests/test_ci_skips.py runs this policy on generated test files


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _reason(longrepr) -> str:
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and in_ci() and item.get_closest_marker("may_skip") is None:
        report.outcome = "failed"
        report.longrepr = (f"required test skipped in CI: {_reason(report.longrepr)}\n"
                           "(only a test that cannot run on a CI machine may skip there: @pytest.mark.may_skip(reason=...))")  # fmt: skip


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci():  # a whole module skipped at import (pytest.importorskip, skip(allow_module_level))
        report.outcome = "failed"
        report.longrepr = f"module skipped in CI: {_reason(report.longrepr)}"
