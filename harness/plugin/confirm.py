"""Same verdict as fresh processes: a reused world's verdict checked on fresh ranks.

A distributed test on a reused world runs on processes that earlier tests ran on. Whatever
they left behind that no reset covers can make it fail where fresh processes would pass it
(or pass where they would fail it). So a test that failed on a reused world runs once more
on fresh ranks (ini ``dist_confirm = fresh``, the default): same seed, world size, backend
and fixture values. Failing again, it is reported as it was; otherwise the fresh run's
verdict stands and the order dependence is reported (:mod:`harness.plugin.order`). With
``--dist-verify`` every test runs both ways, so a test that passes only after another is
found too.

The plugin's session (:mod:`harness.plugin.session`) and ``--dist-mptc``
(:mod:`harness.plugin.mptc`) call :func:`check` after each test on a reused world.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import pytest

from harness.plugin import order
from harness.plugin.replay import FAILED, Step, on_fresh
from harness.plugin.settings import Settings

if TYPE_CHECKING:
    from harness.controller.world import World

_T = TypeVar("_T")


@dataclass(frozen=True)
class Checked(Generic[_T]):
    """What holding a reused world's verdict against fresh processes found.

    Attributes:
        fresh: What the fresh run's attempt returned, where its verdict replaces the reused
            one's; None where the reused verdict stands.
        note: What a failure report says of the check before its repro command
            (``"confirmed on fresh processes; "``; '' when nothing was checked).
        failure: The test's failure when ``dist_order_dependent = fail`` makes an order
            dependence one (None otherwise).
    """

    fresh: _T | None = None
    note: str = ""
    failure: BaseException | None = None


def check(
    item: pytest.Item,
    settings: Settings,
    earlier: Sequence[Step],
    reused: str,
    attempt: Callable[[World], tuple[str, _T]],
    new_world: Callable[[], World],
    options: Sequence[str],
) -> Checked[_T]:
    """Hold a test's verdict on a reused world against fresh processes, where the settings
    ask for it: a failure (``dist_confirm``), any verdict (``--dist-verify``).

    Args:
        item: The test.
        settings: The session's settings.
        earlier: The tests that ran on the reused world before it (none: the world was
            fresh, and nothing is checked).
        reused: How it ended there (``PASSED``, ``FAILED`` or ``SKIPPED``).
        attempt: Runs the test on a world as it ran on the reused one; returns how it
            ended and what the caller needs of the run.
        new_world: Starts a fresh world like the reused one.
        options: What the commands in messages need besides the test ids.
    """
    if not earlier or not (settings.verify or (settings.confirm and reused == FAILED)):
        return Checked()
    try:
        fresh, found = on_fresh(new_world, (), attempt)
    except Exception as exc:  # the fresh world did not start
        return Checked(note=f"not confirmed on fresh processes ({exc}); ")
    if fresh == reused:
        return Checked(note="confirmed on fresh processes; ")
    finding = None
    if settings.bisect_runs:
        finding = order.bisect(
            new_world, earlier, lambda world: attempt(world)[0], reused, settings.bisect_runs
        )
    message = order.message(
        item.config, item.nodeid, [s.nodeid for s in earlier], reused, fresh, finding, options
    )
    try:
        order.report(item, message, fresh, fail=settings.order_dependent == "fail")
    except pytest.fail.Exception as exc:
        return Checked(found, failure=exc)
    return Checked(found)
