"""pytest-timeout and Ctrl-C during a distributed test: the ranks' stacks, not the harness's.

Both stop the pytest process where it waits for the ranks, so left alone they would show
the harness's supervision loop (``selectors.py poll``) and nothing of the ranks.

* **pytest-timeout.** Its timer is armed through its public hooks
  (``pytest_timeout_set_timer`` / ``pytest_timeout_cancel_timer``). While the ranks run, the
  harness pauses that timer and takes pytest-timeout's limit over as the test's deadline
  (the smaller of it and the harness's own ``timeout``; the limit counts from the start of
  the test, setup included, as pytest-timeout counts it, but not the start of a world,
  which has a bound of its own). A hang is then the harness's own ``WorldTimeout`` report
  with every rank's stack. Afterwards the timer is armed again for what is left of the
  limit, so a hanging teardown in the pytest process is still caught. The same holds when a
  wider-scoped rank fixture ends, in the teardown of whichever test runs then.
* **Ctrl-C.** ``World.call`` takes the ranks' stacks before it stops them and attaches them
  to the ``KeyboardInterrupt`` (:func:`harness.errors.interrupt_stacks`); the plugin prints
  them before pytest's KeyboardInterrupt summary.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness import compat
from harness.errors import (
    DistributedError,
    WorldTimeout,
    forget_interrupt_note,
    interrupt_collectives,
    interrupt_stacks,
)

_ARMED = pytest.StashKey[tuple[Any, float]]()
_RUNNING = pytest.StashKey[pytest.Item]()


def timer_armed(item: pytest.Item, settings: Any) -> None:
    """Note that pytest-timeout arms its timer for a test, and when.

    Args:
        item: The test.
        settings: pytest-timeout's ``Settings`` for it (``timeout``, ``method``, ...).
    """
    item.stash[_ARMED] = (settings, time.monotonic())


def runtest_started(item: pytest.Item) -> None:
    """Note the test pytest runs now: a wider-scoped rank fixture ends in its teardown, under
    its pytest-timeout timer, whichever test set the fixture up."""
    item.config.stash[_RUNNING] = item


class PytestTimeout:
    """pytest-timeout's limit on one distributed test, taken over while its ranks run.

    Attributes:
        limit: pytest-timeout's timeout for the test, in seconds.
        end: ``time.monotonic()`` value at which that limit expires.
    """

    def __init__(self, item: pytest.Item, settings: Any, started: float, armed: bool) -> None:
        self._item = item
        self._settings = settings
        self._armed = armed
        self.limit = float(settings.timeout)
        self.end = started + self.limit

    @classmethod
    def of(cls, item: pytest.Item) -> PytestTimeout | None:
        """pytest-timeout's limit on ``item``, or None when none applies.

        Args:
            item: A distributed test, its fixtures set up.

        Returns:
            The limit: from the timer pytest-timeout armed when the test started, or, under
            its ``func_only`` setting (the timer is armed only in the call phase, after the
            ranks ran), from its settings, counted from now.
        """
        armed = item.stash.get(_ARMED, None)
        # Under func_only the timer is armed in the call phase: such a note is a previous
        # run's (pytest-rerunfailures). Without it, pytest-timeout notes each run afresh.
        if armed is not None and not armed[0].func_only:
            settings, started = armed
            return cls(item, settings, started, armed=True)
        settings = compat.pytest_timeout_settings(item)
        if settings is None or not settings.timeout or settings.timeout <= 0:
            return None
        return cls(item, settings, time.monotonic(), armed=False)

    @classmethod
    def in_teardown(cls, config: pytest.Config) -> PytestTimeout | None:
        """The pytest-timeout timer armed for the test whose teardown runs now, or None.

        Args:
            config: The pytest configuration.

        Returns:
            The limit, when pytest-timeout's timer covers that teardown (not under
            ``func_only``, whose timer ends with the call phase).
        """
        item = config.stash.get(_RUNNING, None)
        armed = item.stash.get(_ARMED, None) if item is not None else None
        if item is None or armed is None or armed[0].func_only:
            return None
        settings, started = armed
        return cls(item, settings, started, armed=True)

    def bound(self, timeout: float) -> float:
        """The deadline of the ranks' run: the smaller of ``timeout`` and what is left of the
        limit (rounded up to a tenth of a second, so the report reads ``4.9 s``; pytest-timeout's
        timer is paused meanwhile, so this cannot let it fire first)."""
        left = math.ceil(max(self.end - time.monotonic(), 0.1) * 10) / 10
        return min(timeout, left)

    def pause(self) -> None:
        """Stop pytest-timeout's timer while the harness waits for the ranks (were it to fire
        there, it would show the harness's frames and none of the ranks')."""
        if self._armed:
            self._item.config.hook.pytest_timeout_cancel_timer(item=self._item)

    def resume(self) -> None:
        """Arm pytest-timeout's timer again for the rest of the test (the teardown of the
        pytest process's fixtures): what is left of the limit, or the whole limit once the
        ranks used it up (the harness has reported that timeout; the teardown still gets a
        bound, rather than a second timeout failure the moment it starts)."""
        if not self._armed:
            return
        now = time.monotonic()
        left = self.end - now
        settings = self._settings._replace(timeout=left if left > 0 else self.limit)
        self._item.config.hook.pytest_timeout_set_timer(item=self._item, settings=settings)
        # That call noted the shortened limit; keep pytest-timeout's own and its end instead.
        self._item.stash[_ARMED] = (self._settings, self.end - self.limit if left > 0 else now)

    def explain(self, error: DistributedError, deadline: float, own: float) -> None:
        """Say in a ``WorldTimeout`` whose deadline was this limit (shorter than the test's
        ``own`` timeout) that it was pytest-timeout's."""
        if isinstance(error, WorldTimeout) and deadline < own:
            error.hint = (
                f"The deadline was pytest-timeout's limit of {self.limit:g} s for this test "
                "(it counts the test's setup too); the harness took it over to show the "
                "ranks' stacks."
            )


@contextlib.contextmanager
def taken_over(limit: PytestTimeout | None, timeout: float) -> Iterator[float]:
    """While the ranks run: pytest-timeout's timer paused, its limit taken over as their
    deadline. Yields the deadline (``timeout``, or less of the limit is left)."""
    if limit is None:
        yield timeout
        return
    deadline = limit.bound(timeout)
    limit.pause()
    try:
        yield deadline
    finally:
        limit.resume()


class InterruptReporter:
    """Prints the ranks' stacks when Ctrl-C stopped a distributed test (a plugin object:
    ``pytest_keyboard_interrupt`` is not given the config)."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config

    @pytest.hookimpl(tryfirst=True)  # before the terminal reporter keeps it for its summary
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        print_interrupt(self._config, excinfo)


def print_interrupt(config: pytest.Config, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """Print the ranks' stacks that a ``KeyboardInterrupt`` carries from ``World.call``.

    Printed as it is caught, before pytest's KeyboardInterrupt summary; the note the
    exception carries for an interpreter's traceback is then dropped, as pytest would fold
    it into its one-line summary.

    Args:
        config: The pytest configuration (for its terminal writer).
        excinfo: What pytest caught.
    """
    interrupt = excinfo.value
    found = interrupt_stacks(interrupt)
    if found is None:
        return
    summary, stacks = found
    collectives = interrupt_collectives(interrupt)
    forget_interrupt_note(interrupt)
    blocks = [(f"rank {rank}", _text(text)) for rank, text in sorted(stacks.items())]
    if collectives:
        blocks.insert(0, ("collectives", collectives))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput"):
        # A pytest-xdist worker's terminal output goes nowhere (its stdout is the channel to
        # the controller), but its stderr is the terminal's: Ctrl-C reached it there too.
        out = sys.stderr
        out.write(f"\n{summary}\n")
        for heading, text in blocks:
            out.write(f"---------- {heading} ----------\n{text}\n")
        out.flush()
        return
    reporter.ensure_newline()
    reporter.write_sep("!", "KeyboardInterrupt in a distributed test", red=True)
    reporter.write_line(summary, bold=True)
    for heading, text in blocks:
        reporter.write_sep("-", heading)
        reporter.write_line(text)


def _text(stack: str) -> str:
    return stack.rstrip("\n") if stack.strip() else "(no stack: the process had already ended)"
