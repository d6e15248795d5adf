"""One rank's state, passed to what serves its calls.

It is made once by :func:`harness.rank.loop.main`, which installs it as the process's
(:mod:`harness.rank.current`). It holds what outlives a call: who the rank is, its pipe,
files and coverage, the process groups that outlive every call, the fixtures of a wider
scope, the test modules imported, the log capture and the last call's recorder; and the
call in progress (:class:`Running`), with its recorder and leak watch.
"""

from __future__ import annotations

import sys
import threading
import time
import unittest
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NoReturn

from harness.protocol.failures import RankFailure
from harness.protocol.messages import Failing, Fired, RankSetup
from harness.protocol.rank_files import RankFiles, flush_std_streams
from harness.rank import (
    CODE_DIR,
    coverage,
    exits,
    fixtures,
    importer,
    leaks,
    logs,
    memory,
    output,
    recording,
)

if TYPE_CHECKING:
    from harness.rank.inject import Target


@dataclass
class Running:
    """The call in progress.

    Attributes:
        recorder: Records its collectives.
        watch: Watches it for leaks (None: nothing does).
        failing: The exception :meth:`RankContext.report_failing` sent for it, with when
            (None until then).
    """

    recorder: recording.Recorder
    watch: leaks.Watch | None = None
    failing: tuple[BaseException, float] | None = None


class RankContext:
    """A rank's state for its life; ``cov``: its coverage, None where the controller has none.

    Attributes:
        fixtures: The rank-side fixtures of a wider scope than a function, alive until their
            scope ends.
        importer: Imports the test modules, and keeps those found.
        logs: The log capture of the pytest test in progress; its handler, kept.
        running: The call in progress (None between calls).
        last_recorder: The recorder of the last call that ended (None before the first).
    """

    def __init__(
        self, setup: RankSetup, conn: Connection, files: RankFiles, cov: Any = None
    ) -> None:
        self.setup, self.conn, self.files, self.cov = setup, conn, files, cov
        self.rank = setup.rank
        # Where a call's output goes; its capture is made once and kept.
        self.output = output.Router(files, setup.rank)
        # The process groups that outlive every call: the harness's default group (made at
        # start-up or by the last Regroup); none in a world without a harness group.
        self.baseline_groups: set[Any] = set()
        self.fixtures = fixtures.Scopes()
        self.importer = importer.Importer()
        self.logs = logs.LogState()
        self.memory = memory.Memory()
        self.running: Running | None = None
        self.last_recorder: recording.Recorder | None = None
        # Held by the thread that ends the process (main or watchdog), so the other cannot
        # call os._exit while coverage data is still being written.
        self._exiting = threading.Lock()

    @contextmanager
    def calling(self, running: Running) -> Iterator[None]:
        """Make ``running`` the call in progress for the block."""
        self.running = running
        try:
            yield
        finally:
            # The last recorder first: the watchdog may take a trace between the two.
            self.last_recorder = running.recorder
            self.running = None

    def report_failing(self, exc: BaseException) -> None:
        """Send ``Failing`` for ``exc`` now, before the teardown that may take long.

        The call's ``Failed`` still follows, dated alike. Nothing outside a call, for a
        skip, or for a call that already reported one.
        """
        running = self.running
        if running is None or running.failing is not None or skip_kind(exc):
            return
        at = time.monotonic()
        recorder = running.recorder
        if recorder.plan is not None and recorder.plan.caused(exc):
            return  # a fault's error: no failure by itself, so no grace period for the peers
        try:
            self.conn.send(Failing(failure(exc, self.rank), at, recorder.trace()))
        except Exception:
            return  # the call's Failed says it, later
        running.failing = (exc, at)

    def fire(self, index: int, what: str, ends: bool, target: Target) -> None:
        """Send ``Fired``: fault ``index`` of the call in progress acts, at ``target``."""
        running = self.running
        issued = running.recorder.trace() if running is not None else None
        self.conn.send(Fired(index, what, time.monotonic(), ends, issued, *target))
        flush_std_streams()

    def exit(self, code: int) -> NoReturn:
        """Leave the process at once: no atexit handlers, no destructors that could hang."""
        self._exiting.acquire()  # a second caller waits here until the first one's os._exit
        flush_std_streams()
        coverage.save(self.cov)
        leaks.kill_children()
        exits.real_exit(code)


def skip_kind(exc: BaseException) -> str | None:
    """``"unittest"`` or ``"pytest"`` where ``exc`` skips the test; else None."""
    if isinstance(exc, unittest.SkipTest):
        return "unittest"
    # pytest is only imported where a test imported it: then its skip is what was raised.
    pytest = sys.modules.get("pytest")
    if pytest is not None and isinstance(exc, pytest.skip.Exception):
        return "pytest"
    return None


def failure(exc: BaseException, rank: int, context: str | None = None) -> RankFailure:
    """``exc`` as this rank's failure, the rank side's own frames left out."""
    return RankFailure.from_exception(exc, rank, hidden_dir=CODE_DIR, context=context)
