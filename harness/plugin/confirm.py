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

if TYPE_CHECKING:
    from harness.controller.world import World

CONFIRM_CHOICES = ("fresh", "off")
ORDER_CHOICES = ("warn", "fail")
DEFAULT_BISECT_RUNS = 8

_T = TypeVar("_T")


@dataclass(frozen=True)
class Settings:
    """How the session checks verdicts against fresh processes.

    Attributes:
        confirm: Whether a failure on a reused world is run again on fresh ranks.
        order_dependent: ``"warn"`` (the fresh verdict stands, a warning names the order
            dependence) or ``"fail"`` (the test fails with that message).
        bisect_runs: How many fresh worlds the search for the culprit may use.
        verify: ``--dist-verify``: every test also runs on fresh ranks, pass or fail.
    """

    confirm: bool = True
    order_dependent: str = "warn"
    bisect_runs: int = DEFAULT_BISECT_RUNS
    verify: bool = False


def settings(config: pytest.Config) -> Settings:
    """The session's settings from ``--dist-verify`` and ini ``dist_confirm``,
    ``dist_order_dependent`` and ``dist_bisect_runs``.

    Raises:
        pytest.UsageError: A value that is not valid, named with what would be.
    """
    confirm = _choice(config, "dist_confirm", CONFIRM_CHOICES)
    dependent = _choice(config, "dist_order_dependent", ORDER_CHOICES)
    raw = str(config.getini("dist_bisect_runs") or DEFAULT_BISECT_RUNS).strip()
    if not raw.isdecimal():
        raise pytest.UsageError(
            f"ini option dist_bisect_runs must be a whole number >= 0 (fresh worlds the "
            f"search for an order dependence may start), got {raw!r}"
        )
    return Settings(
        confirm=confirm == "fresh",
        order_dependent=dependent,
        bisect_runs=int(raw),
        verify=bool(config.getoption("dist_verify", False)),
    )


def _choice(config: pytest.Config, name: str, choices: tuple[str, ...]) -> str:
    value = str(config.getini(name) or choices[0]).strip()
    if value not in choices:
        raise pytest.UsageError(
            f"ini option {name} must be one of {', '.join(choices)}, got {value!r}"
        )
    return value


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
