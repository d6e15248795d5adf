"""Shared fixtures of the harness core tests: real processes, real Gloo, no mocks."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from harness_testutil import BACKEND, SAFETY_TIMEOUT_S

import harness

if not sys.platform.startswith("linux"):
    collect_ignore_glob = ["test_*.py"]  # the tests inspect /proc


@pytest.fixture(scope="module")
def world2() -> Iterator[harness.World]:
    """A 2-rank world shared by the tests of one module (the harness rebuilds it after errors)."""
    with harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S) as world:
        yield world


@pytest.fixture(scope="module")
def world3() -> Iterator[harness.World]:
    """A 3-rank world shared by the tests of one module."""
    with harness.World(3, backend=BACKEND, timeout=SAFETY_TIMEOUT_S) as world:
        yield world
