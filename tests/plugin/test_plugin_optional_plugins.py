"""This suite without its optional pytest plugins: a test that relies on one skips, naming it,
and none waits for a limit that nobody enforces.

The tests that plant a hang for pytest-timeout to end are marked
``@pytest.mark.needs_plugin("timeout")`` (``tests/conftest.py``). Run without that plugin
(``-p no:timeout``, as where it is not installed), each of them must skip at once: one that
ran instead would wait until this test's own bound and fail it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

INTERRUPTS = Path(__file__).with_name("test_plugin_interrupts.py")

BOUND_S = 600
"""A bound far above what the skips take even on a loaded machine: a hang, not a slow run,
is what reaching it means."""


def _marked(path: Path) -> int:
    """How many tests of ``path`` need pytest-timeout, counted as pytest collects them."""
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", "needs_plugin", str(path)],
        capture_output=True, text=True, timeout=BOUND_S,
    )  # fmt: skip
    return sum("::" in line for line in collected.stdout.splitlines())


def test_tests_that_need_pytest_timeout_skip_without_it_and_never_wait() -> None:
    marked = _marked(INTERRUPTS)
    assert marked >= 4  # the pytest-timeout cases of the interrupts tests
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:timeout", "-p", "no:cacheprovider",
             "-q", "-rs", "-m", "needs_plugin", str(INTERRUPTS)],
            capture_output=True, text=True, timeout=BOUND_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"a test that needs pytest-timeout waited without it:\n{exc.stdout}")
    assert result.returncode == 0, result.stdout + result.stderr
    reason = "needs the pytest plugin 'timeout' (pip install pytest-timeout), not active"
    assert result.stdout.count(reason) >= 1, result.stdout
    assert f"{marked} skipped" in result.stdout, result.stdout
    assert "passed" not in result.stdout, result.stdout
    assert "failed" not in result.stdout, result.stdout
