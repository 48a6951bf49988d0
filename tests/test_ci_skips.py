"""The suite's CI policy (conftest.py at the repository root): with CI set, skipping a required test fails."""

from pathlib import Path

import pytest

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

CASES = """
import pytest

def test_runs():
    pass

def test_skips_at_run_time():
    pytest.skip("the entry point is not installed")

@pytest.mark.skipif(True, reason="the client library is not installed")
def test_skipif():
    pass

@pytest.mark.may_skip(reason="a browser cannot be installed on every machine")
def test_opted_out():
    pytest.skip("no browser")

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_expected_failure():
    assert False
"""

MODULE_SKIP = """
import pytest

pytest.importorskip("no_such_module_for_the_ci_policy_test")

def test_never_collected():
    pass
"""


def run(pytester, monkeypatch, ci: str, files: dict):
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    may_skip(reason): may skip even in CI\n")
    pytester.makepyfile(**files)
    return pytester.runpytest("-p", "no:cacheprovider", "-rfs")


@pytest.mark.parametrize("ci, outcomes", [
    ("true", {"passed": 1, "failed": 1, "errors": 1, "skipped": 1, "xfailed": 1}),  # a skipif fails in setup: an error
    ("1", {"passed": 1, "failed": 1, "errors": 1, "skipped": 1, "xfailed": 1}),
    ("", {"passed": 1, "skipped": 3, "xfailed": 1}),
    ("false", {"passed": 1, "skipped": 3, "xfailed": 1}),
])  # fmt: skip
def test_skips_fail_in_ci_unless_the_test_opted_out(pytester, monkeypatch, ci, outcomes):
    result = run(pytester, monkeypatch, ci, {"test_cases": CASES})
    result.assert_outcomes(**outcomes)
    if outcomes.get("failed"):
        result.stdout.fnmatch_lines(["*required test skipped in CI: the entry point is not installed*"], consecutive=False)
        result.stdout.fnmatch_lines(["*required test skipped in CI: the client library is not installed*"], consecutive=False)


@pytest.mark.parametrize("ci, outcomes", [("true", {"errors": 1}), ("", {"skipped": 1})])
def test_a_module_skipped_at_import_fails_in_ci(pytester, monkeypatch, ci, outcomes):
    result = run(pytester, monkeypatch, ci, {"test_module_skip": MODULE_SKIP})
    result.assert_outcomes(**outcomes)
    assert result.ret == (pytest.ExitCode.INTERRUPTED if ci else pytest.ExitCode.NO_TESTS_COLLECTED)
