"""pytest-timeout and Ctrl-C during a distributed test: the ranks' stacks, not the harness's.

Left alone, both would stop the pytest process where it waits for the ranks and show the
harness's supervision loop (``selectors.py poll``), nothing of the ranks.

* **pytest-timeout.** While the ranks run, its timer is paused (through its public hooks)
  and its limit, counted from the start of the test as pytest-timeout counts it (but not
  the start of a world, which has a bound of its own), is their deadline where it is the
  smaller: a hang is then the harness's ``WorldTimeout`` with every rank's stack. The timer
  is then armed again for what is left (where nothing is, for the larger of the limit and
  the test's own timeout), so a hanging teardown is still caught; the same holds where a
  wider-scoped rank fixture ends, in whichever test's teardown.
* **Ctrl-C.** ``World.call`` attaches the ranks' stacks to the ``KeyboardInterrupt``
  (:func:`harness.errors.interrupt_sections`); they are printed before pytest's summary, and
  the session then ends without work that would only delay its exit.
"""

from __future__ import annotations

import contextlib
import gc
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from harness import compat
from harness.errors import (
    DistributedError,
    WorldHang,
    WorldTimeout,
    forget_interrupt_note,
    interrupt_sections,
    interrupt_stacks,
)
from harness.plugin import item_state

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
        item_state.of(item).armed = (settings, time.monotonic())

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> None:
        self._config.stash[_RUNNING] = item  # whose teardown a rank fixture's scope ends in

    @pytest.hookimpl(tryfirst=True)  # before the terminal reporter keeps it for its summary
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        if not self._config.option.fulltrace:
            # Only the traceback entry pytest's summary line names: it prints that one line,
            # yet formats all of it first, reading and parsing every file on the way, while
            # the terminal (and pytest-xdist's workers) wait.
            shown = excinfo.traceback.filter(excinfo)  # the summary names the last one shown
            if shown:
                excinfo.traceback = shown[-1:]
        # Print the ranks' stacks the interrupt carries from World.call, and drop the note
        # it carries for an interpreter's traceback (pytest would fold it into one line).
        interrupt = excinfo.value
        found = interrupt_stacks(interrupt)
        if found is None:
            return
        # The final garbage collections of the interpreter, and pytest's at unconfigure,
        # would walk every object torch has made: what exists now is out of their reach
        # (the process ends from here; a cycle left then is freed with the process), unless
        # nanobind would then report it all as leaked.
        if not compat.nanobind_loaded():
            gc.freeze()
        summary = found[0]
        blocks = interrupt_sections(interrupt)  # as the note reads: collectives, then ranks
        forget_interrupt_note(interrupt)
        reporter = self._config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or hasattr(self._config, "workerinput"):
            # A pytest-xdist worker's terminal output goes nowhere (its stdout is the channel to
            # the controller), but its stderr is the terminal's: Ctrl-C reached it there too.
            sys.stderr.write(f"\n{summary}\n")
            for heading, text in blocks:
                sys.stderr.write(f"---------- {heading} ----------\n{text}\n")
            sys.stderr.flush()
            return
        reporter.ensure_newline()
        reporter.write_sep("!", "KeyboardInterrupt in a distributed test", red=True)
        reporter.write_line(summary, bold=True)
        for heading, text in blocks:
            reporter.write_sep("-", heading)
            reporter.write_line(text)


@dataclass
class Deadline:
    """The ranks' deadline in ``seconds``, and pytest-timeout's ``limit`` where that set it."""

    seconds: float
    limit: float | None = None

    def explain(self, error: DistributedError | None) -> None:
        """Say in a ``WorldTimeout`` (not a ``WorldHang``) that pytest-timeout set its deadline."""
        if isinstance(error, WorldTimeout) and not isinstance(error, WorldHang) and self.limit:
            error.hint = (
                f"The deadline was pytest-timeout's limit of {self.limit:g} s for this test "
                "(it counts the test's setup too); the harness took it over to show the "
                "ranks' stacks."
            )


@contextlib.contextmanager
def taken_over(item: pytest.Item, timeout: float, *, teardown: bool = False) -> Iterator[Deadline]:
    """While the ranks run: pytest-timeout's timer on ``item`` paused, and as their deadline
    ``timeout``, or what is left of its limit where that is less (rounded up to a tenth of a
    second, so that a report reads ``4.9 s``).

    The limit counts from when pytest-timeout armed its timer or, under its ``func_only``
    (the timer is armed only in the call phase, after the ranks ran), from now. With
    ``teardown``, it is the limit on the teardown that runs now, whichever test's that is
    (none under ``func_only``).
    """
    if teardown:
        item = item.config.stash.get(_RUNNING, item)
    armed = item_state.of(item).armed
    # Under func_only a note is a previous run's (pytest-rerunfailures).
    if armed is not None and armed[0].func_only:
        armed = None
    settings, started = armed if armed is not None else (None, time.monotonic())
    if settings is None and not teardown:
        settings = compat.pytest_timeout_settings(item)
    if settings is None or not settings.timeout or settings.timeout <= 0:
        yield Deadline(timeout)
        return
    limit = float(settings.timeout)
    end = started + limit
    left = math.ceil(max(end - time.monotonic(), 0.1) * 10) / 10
    if armed:
        item.config.hook.pytest_timeout_cancel_timer(item=item)
    try:
        yield Deadline(left, limit) if left < timeout else Deadline(timeout)
    finally:
        if armed:
            # Armed again for what is left. Once the ranks used it up, that timeout is
            # reported, and what follows (the report, the teardown) still gets a bound: the
            # larger of the limit and the test's own timeout, not a short limit again, which
            # a loaded machine's garbage collection alone can outlast.
            now = time.monotonic()
            rest = end - now
            again = settings._replace(timeout=rest if rest > 0 else max(limit, timeout))
            item.config.hook.pytest_timeout_set_timer(item=item, settings=again)
            # That call noted the shortened limit: keep pytest-timeout's own, and its end.
            item_state.of(item).armed = (settings, end - limit if rest > 0 else now)
