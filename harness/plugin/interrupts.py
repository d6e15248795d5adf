"""pytest-timeout and Ctrl-C during a distributed test: the ranks' stacks, not the harness's.

Left alone, both would stop the pytest process where it waits for the ranks and show the
harness's supervision loop (``selectors.py poll``), nothing of the ranks.

* **pytest-timeout.** While the ranks run, its timer is paused (through its public hooks)
  and its limit, counted from the start of the test as pytest-timeout counts it (but not
  the start of a world, which has a bound of its own), is their deadline where it is the
  smaller: a hang is then the harness's ``WorldTimeout`` with every rank's stack. The timer
  is then armed again for what is left, so a hanging teardown is still caught; the same
  holds where a wider-scoped rank fixture ends, in whichever test's teardown.
* **Ctrl-C.** ``World.call`` attaches the ranks' stacks to the ``KeyboardInterrupt``
  (:func:`harness.errors.interrupt_stacks`); they are printed before pytest's summary.
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


class Hooks:
    """This module's hooks, registered by the plugin (an object: ``pytest_keyboard_interrupt``
    is not given the config)."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config

    # Every test's timer, not only distributed ones': a wider-scoped rank fixture may end in
    # the teardown of any test. Returning nothing lets pytest-timeout arm its timer.
    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> None:
        item.stash[_ARMED] = (settings, time.monotonic())

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> None:
        self._config.stash[_RUNNING] = item  # whose teardown a rank fixture's scope ends in

    @pytest.hookimpl(tryfirst=True)  # before the terminal reporter keeps it for its summary
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        # Print the ranks' stacks the interrupt carries from World.call, and drop the note
        # it carries for an interpreter's traceback (pytest would fold it into one line).
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
        reporter = self._config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or hasattr(self._config, "workerinput"):
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


class PytestTimeout:
    """pytest-timeout's limit on one test, taken over while its ranks run (no limit where
    pytest-timeout sets none).

    Attributes:
        limit: pytest-timeout's timeout for the test, in seconds (``inf``: none).
        end: The ``time.monotonic()`` at which it expires.
    """

    def __init__(
        self, item: pytest.Item, settings: Any = None, started: float = 0.0, armed: bool = False
    ) -> None:
        self._item = item
        self._settings = settings
        self._armed = armed
        self.limit = math.inf if settings is None else float(settings.timeout)
        self.end = started + self.limit
        self._deadline = self._own = 0.0

    @classmethod
    def of(cls, item: pytest.Item, *, teardown: bool = False) -> PytestTimeout:
        """The limit on a test whose fixtures are set up, counted from when pytest-timeout
        armed its timer, or, under its ``func_only`` (the timer is armed only in the call
        phase, after the ranks ran), from now; with ``teardown``, the limit on the teardown
        that runs now, whichever test that is (none under ``func_only``)."""
        if teardown:
            item = item.config.stash.get(_RUNNING, item)
        armed = item.stash.get(_ARMED, None)
        # Under func_only a note is a previous run's (pytest-rerunfailures).
        if armed is not None and not armed[0].func_only:
            return cls(item, *armed, armed=True)
        settings = None if teardown else compat.pytest_timeout_settings(item)
        if settings is None or not settings.timeout or settings.timeout <= 0:
            return cls(item)
        return cls(item, settings, time.monotonic())

    @contextlib.contextmanager
    def taken_over(self, timeout: float) -> Iterator[float]:
        """While the ranks run: pytest-timeout's timer paused (were it to fire there, it would
        show the harness's frames and none of the ranks'), its limit their deadline.

        Yields:
            The deadline: ``timeout``, or what is left of the limit where that is less
            (rounded up to a tenth of a second, so that a report reads ``4.9 s``).
        """
        self._deadline = self._own = timeout
        if self._settings is not None:
            left = math.ceil(max(self.end - time.monotonic(), 0.1) * 10) / 10
            self._deadline = min(timeout, left)
        if self._armed:
            self._item.config.hook.pytest_timeout_cancel_timer(item=self._item)
        try:
            yield self._deadline
        finally:
            if self._armed:
                self._resume()

    def _resume(self) -> None:
        # What is left of the limit, or the whole limit once the ranks used it up (that
        # timeout is reported; the teardown still gets a bound, not a second timeout).
        now = time.monotonic()
        left = self.end - now
        settings = self._settings._replace(timeout=left if left > 0 else self.limit)
        self._item.config.hook.pytest_timeout_set_timer(item=self._item, settings=settings)
        # That call noted the shortened limit; keep pytest-timeout's own and its end instead.
        self._item.stash[_ARMED] = (self._settings, self.end - self.limit if left > 0 else now)

    def explain(self, error: DistributedError | None) -> None:
        """Say in a ``WorldTimeout`` whose deadline was this limit that it was pytest-timeout's."""
        if isinstance(error, WorldTimeout) and self._deadline < self._own:
            error.hint = (
                f"The deadline was pytest-timeout's limit of {self.limit:g} s for this test "
                "(it counts the test's setup too); the harness took it over to show the "
                "ranks' stacks."
            )


def _text(stack: str) -> str:
    return stack.rstrip("\n") if stack.strip() else "(no stack: the process had already ended)"
