"""One test's state between pytest's hooks: one record on the item, in place of stash keys.

A distributed test runs on its ranks in pytest's setup phase; what that run leaves for the
later phases and their reports (the call phase's failure, the ranks' times and logs, the
repro line...) is kept here, as are the answers each hook would otherwise ask again (the
test's marker). It holds plain values and callables, never a type of the modules that
write it, so that it imports none of them. :func:`of` gives an item's record, made on first
use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

_STATE = pytest.StashKey["ItemState"]()


@dataclass
class ItemState:
    """What the plugin keeps of one test.

    Attributes:
        mark: The plugin's marker the test runs with, in a tuple once looked up (None is
            an answer: a test without one).
        armed: pytest-timeout's settings for it and when its timer started
            (:mod:`harness.plugin.interrupts`).
        call: What its call phase raises: a failure, or a skip's reason.
        call_phase: What runs in its call phase in place of raising ``call``: a ``@given``
            test's examples (:mod:`harness.plugin.properties`).
        moved: The seconds of the ranks' call and teardown that the setup phase's duration
            holds, for those phases' reports.
        logs: The ranks' log records of the test's call and teardown, by phase.
        repro: The line a failure report ends with.
        trace_line: The line naming the test's trace folder, after the repro line.
        skip_site: Where the ranks raised the test's skip.
        verify_failed: The name of the ``verify=`` function that failed after the test.
    """

    mark: tuple[pytest.Mark | None] | None = None
    armed: tuple[Any, float] | None = None
    call: BaseException | str | None = None
    call_phase: Callable[[], None] | None = None
    moved: tuple[float, float] | None = None
    logs: dict[str, str] | None = None
    repro: str = ""
    trace_line: str = ""
    skip_site: tuple[str, int] | None = None
    verify_failed: str = ""


def peek(item: pytest.Item) -> ItemState | None:
    """The plugin's record of ``item``; None where nothing was kept of it."""
    return item.stash.get(_STATE, None)


def of(item: pytest.Item) -> ItemState:
    """The plugin's record of ``item``, made on first use."""
    state = peek(item)
    if state is None:
        state = item.stash[_STATE] = ItemState()
    return state
