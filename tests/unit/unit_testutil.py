"""Helpers of the unit tier."""

from __future__ import annotations

import subprocess
import sys


def fresh_python(script: str) -> str:
    """What ``script`` prints when run by a new interpreter (one with nothing imported or
    started by this test process); it must exit with 0."""
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,  # a safety bound only
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
