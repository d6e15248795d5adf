"""Fixtures of mylib's tests. They are set up once, in the pytest process, and their values
are sent to every rank (so they must pickle)."""

from __future__ import annotations

import pytest


@pytest.fixture
def dataset() -> list[int]:
    """The items a data-parallel job would split between its ranks."""
    return list(range(10))


@pytest.fixture
def seed() -> int:
    """One seed for all ranks, so that every rank builds the same model."""
    return 1234
