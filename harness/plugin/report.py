"""How a distributed test reads in pytest's reports.

A failure is not a traceback through the harness's code: the report's first line says which
rank failed and how; then come the verdicts on the ranks' collectives where they disagree,
each failing rank's traceback (root cause first) and a ``collectives`` section, as
``DistributedError.report`` lays them out, and last the command that reproduces the failure
(:func:`repro`). The ranks' captured output and log records become
report sections. The whole test runs on the ranks in pytest's setup phase; the durations
the ranks measured for its call and teardown are moved to those phases' reports
(:func:`keep_times`), a skip is reported at the line that raised it (:func:`keep_skip_site`)
and the harness's warnings about a test at the test (:func:`warnings_at`).
"""

from __future__ import annotations

import os
import shlex
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.errors import DistributedError
from harness.plugin import item_state
from harness.plugin.settings import randomly_seed
from harness.protocol.failures import PHASES
from harness.protocol.pytest_calls import LOG_MARK

VERIFIED = "dist_verify"
"""The ``user_properties`` name under which a test run again on fresh processes under
``--dist-verify`` notes whether the two verdicts agreed (``"same"``) or not (``"differs"``)."""

SCHEDULES = "dist_schedules"
"""The ``user_properties`` name under which a test run under schedules
(:mod:`harness.plugin.schedules`) notes what they did, one line for the terminal summary."""

GPU_TESTS = "dist_gpus"
"""The ``user_properties`` name under which a distributed test that needs GPUs notes
``"ran"`` (it got them) or ``"skipped"`` (the run has fewer than it needs)."""

SHADOWS = "dist_shadow"
"""The ``user_properties`` name under which a test with shadow worlds notes its line of the
terminal summary: ``test_x.py::test_a: shadow worlds: 2 (as the real run): agrees; 1024:
agrees (41.2 s)``."""

# The harness's own files: a warning located there is about the test.
_HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@dataclass(frozen=True)
class CrashLine:
    """Where and what, in one line: what ``-ra``, ``--tb=line`` and JUnit XML show (pytest
    reads these three attributes of a report's ``longrepr.reprcrash``)."""

    path: str
    lineno: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.lineno}: {self.message}"


class DistributedFailureRepr:
    """The long representation of a failed distributed test (pytest takes any object with
    ``toterminal(writer)`` as a report's ``longrepr``)."""

    def __init__(self, error: DistributedError, item: pytest.Item) -> None:
        self.error = error
        self._repro = repro(item)
        self._trace_line = item_state.of(item).trace_line
        self._headline = f"{type(error).__name__}: {error.summary}"
        path, lineno, _ = item.location
        self.reprcrash = CrashLine(
            str(Path(item.config.rootpath, path)), (lineno or 0) + 1, self._headline
        )

    def _lines(self) -> Iterator[tuple[str, str | None, dict[str, bool]]]:
        """The report's lines, for both outputs: ``(text, None, markup)``, or a separator
        ``("", heading, {})``."""
        error = self.error
        yield self._headline, None, {"red": True, "bold": True}
        verdicts, parts = error.report()
        for verdict in verdicts:
            yield verdict, None, {"red": True}
        for heading, text in parts:
            yield "", heading, {}
            lines = text.splitlines()
            # A traceback's last line is its exception; the collectives section has none.
            last = len(lines) - 1 if heading != "collectives" else -1
            for number, line in enumerate(lines):
                yield line, None, {"red": number == last}
        for extra, markup in ((error.hint, {"bold": True}), (self._repro, {})):
            if extra:
                yield "", None, {}
                yield extra, None, markup
        if self._trace_line:
            if not self._repro:
                yield "", None, {}
            yield self._trace_line, None, {}

    def toterminal(self, tw: Any) -> None:
        for line, heading, markup in self._lines():
            if heading is not None:
                tw.sep("-", heading)
            else:
                tw.line(line, **markup)

    def __str__(self) -> str:
        # What pytest-xdist sends back from a worker, and what --tb=native falls back to:
        # no markup, separators 80 wide as pytest draws them.
        out = []
        for line, heading, _ in self._lines():
            fill = "-" * max((80 - len(heading or "") - 2) // 2, 1)
            out.append(line if heading is None else f"{fill} {heading} {fill}")
        return "\n".join(out).rstrip("\n")


def add_output_sections(item: pytest.Item, outputs: dict[int, tuple[str, str]]) -> None:
    """Attach each rank's captured output to the report as pytest shows captured output,
    and its log records (:mod:`harness.rank.logs`) as ``Captured log`` sections, each line
    prefixed with the rank."""
    logs: dict[str, list[str]] = {}
    for rank, (out, err) in sorted(outputs.items()):
        if LOG_MARK in err:
            kept = []
            for line in err.split("\n"):
                if line.startswith(LOG_MARK):
                    phase, _, text = line[len(LOG_MARK) :].partition(" ")
                    logs.setdefault(phase, []).append(f"[rank {rank}] {text}")
                else:
                    kept.append(line)
            err = "\n".join(kept)
        if out:
            item.add_report_section("call", f"rank {rank} stdout", out)
        if err:
            item.add_report_section("call", f"rank {rank} stderr", err)
    if "setup" in logs:
        item.add_report_section("setup", "log", "\n".join(logs.pop("setup")))
    # The others once their phase is reported: a section added now would be in the reports
    # of every phase, and pytest shows the teardown's again after the call's failure.
    if logs:
        item_state.of(item).logs = {phase: "\n".join(lines) for phase, lines in logs.items()}


def keep_times(item: pytest.Item, times: tuple[float, float, float] | None) -> None:
    """Note how long the ranks took in the test's setup, call and teardown (one rank's
    times; None: unknown), for the reports of pytest's phases."""
    item_state.of(item).moved = None if times is None else (times[1], times[2])


def keep_skip_site(item: pytest.Item, site: tuple[str, int] | None) -> None:
    """Note where the ranks raised the test's skip (None: unknown; it is shown at the test)."""
    item_state.of(item).skip_site = site


@contextmanager
def warnings_at(item: pytest.Item) -> Iterator[None]:
    """The warnings of the block, issued again, those the harness located in its own code
    (``World.call``'s about what a test left behind, or about a rebuilt world) at the test,
    as pytest shows a warning the test caused; each keeps its category."""
    with warnings.catch_warnings(record=True) as caught:
        yield
    if not caught:
        return
    path, lineno, _ = item.location
    for found in caught:
        filename, line = found.filename, found.lineno
        if filename.startswith(_HARNESS_DIR):
            filename, line = str(item.config.rootpath / path), (lineno or 0) + 1
        warnings.warn_explicit(found.message, found.category, filename, line)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> pytest.TestReport | None:
    # A plain implementation, not a wrapper: for every other test (and phase) this costs a
    # stash lookup and an attribute check, and pytest builds the report itself (from the
    # CallInfo, whose times are adjusted in place, so that every plugin sees them).
    state = item_state.peek(item)
    if state is not None:
        _move_times(state, call)
        _add_logs(item, state, call.when)
    excinfo = call.excinfo
    if excinfo is None:
        return None
    skipped = isinstance(excinfo.value, pytest.skip.Exception)
    if skipped and state is not None and state.skip_site is not None:
        path, line = state.skip_site
        state.skip_site = None
        report = pytest.TestReport.from_item_and_call(item, call)
        if report.skipped and isinstance(report.longrepr, tuple):
            report.longrepr = (path, line, report.longrepr[2])
        return report
    if not isinstance(excinfo.value, DistributedError):
        return None
    report = pytest.TestReport.from_item_and_call(item, call)
    if report.failed:
        longrepr: Any = DistributedFailureRepr(excinfo.value, item)
        report.longrepr = longrepr
    return report


def _add_logs(item: pytest.Item, state: item_state.ItemState, when: str) -> None:
    """The ranks' log sections of phase ``when``; at teardown, all that are left (there was
    no call phase after a failed setup)."""
    logs = state.logs
    if logs is None:
        return
    for phase in PHASES:
        if phase in logs and (phase == when or when == "teardown"):
            item.add_report_section(phase, "log", logs.pop(phase))
    if not logs:
        state.logs = None


def _move_times(state: item_state.ItemState, call: pytest.CallInfo[None]) -> None:
    """Give the ranks' call and teardown time, held by the setup phase (in which the ranks
    ran the whole test), to the call and teardown phases; their sum stays as pytest measured."""
    if state.moved is None:
        return
    into_call, into_teardown = state.moved
    if call.when == "setup":
        taken = min(into_call + into_teardown, call.duration)
        call.duration -= taken
        call.stop -= taken
        # Never more than the setup phase held (clocks of two processes, rounding).
        into_call = min(into_call, taken)
        state.moved = (into_call, taken - into_call)
    elif call.when == "call":
        call.start -= into_call + into_teardown
        call.stop -= into_teardown
        call.duration += into_call
    elif call.when == "teardown":
        state.moved = None
        call.start -= into_teardown
        call.duration += into_teardown


def command(config: pytest.Config, nodeids: Sequence[str], option: str) -> str:
    """The pytest command line, for the directory pytest was started from, that runs these
    tests in this order as this run did: with ``option``, and under pytest-randomly with its
    seed (the harness seeds each test from it) and, for several tests, without shuffling."""
    start = str(config.invocation_params.dir)
    root = str(config.rootpath)
    args = []
    for nodeid in nodeids:
        path, sep, rest = nodeid.partition("::")
        if start != root:
            path = os.path.relpath(os.path.join(root, path), start)
        args.append(shlex.quote(path + sep + rest))
    args.append(option)
    seed = randomly_seed(config)
    if seed is not None:
        args.append(f"--randomly-seed={seed}")
        if len(nodeids) > 1:
            args.append("--randomly-dont-reorganize")
    return "pytest " + " ".join(args)


def set_repro(item: pytest.Item, note: str, world: str, option: str) -> None:
    """Note the line a failure report of ``item`` ends with (see :func:`repro`): ``note``
    (what the runner's check on fresh processes found), then ``run (2 ranks, gloo): pytest
    ... --dist-backend=gloo`` for ``world`` and ``option``."""
    item_state.of(
        item
    ).repro = f"{note}run ({world}): {command(item.config, [item.nodeid], option)}"


def set_trace_line(item: pytest.Item, line: str) -> None:
    """Note the line a failure report of ``item`` ends with, after the repro line: where
    its trace folder is (``--dist-trace-dir``; '': no line)."""
    item_state.of(item).trace_line = line


def repro(item: pytest.Item) -> str:
    """The line a failure report of ``item`` ends with: the command that reproduces it,
    and whether fresh processes confirmed it ('' when none was noted)."""
    state = item_state.peek(item)
    return state.repro if state is not None else ""
