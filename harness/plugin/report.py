"""Where a distributed failure is turned into a pytest report.

pytest would show a ``DistributedError`` as a traceback through the harness's own code. The
report instead shows what a reader needs: one line that says which rank failed and how,
the verdicts on the ranks' collectives when they disagree, then each failing rank's
traceback under a ``rank N`` heading, root cause first, and a ``collectives`` section (laid
out by ``DistributedError.report``, as ``str()`` of the error is), and last the command that
reproduces the failure (:func:`harness.plugin.order.repro`). The ranks' captured output is
attached as report sections ``rank N stdout`` / ``rank N stderr``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from harness.errors import DistributedError
from harness.plugin import order


class _Writer(Protocol):
    """The part of pytest's terminal writer a report uses (pytest does not export its type)."""

    def line(self, s: str = "", **markup: bool) -> None: ...

    def sep(self, sepchar: str, title: str | None = None, **markup: bool) -> None: ...


@dataclass(frozen=True)
class CrashLine:
    """Where and what, in one line: what ``-ra``, ``--tb=line`` and JUnit XML show.

    pytest reads ``path``, ``lineno`` and ``message`` of a report's ``longrepr.reprcrash``.
    """

    path: str
    lineno: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.lineno}: {self.message}"


class DistributedFailureRepr:
    """The long representation of a failed distributed test.

    pytest accepts any object with ``toterminal(writer)`` as a report's ``longrepr``; its
    own base class for that is private, and nothing of it is needed here.
    """

    def __init__(self, error: DistributedError, item: pytest.Item) -> None:
        self.error = error
        self._repro = order.repro(item)
        self._headline = f"{type(error).__name__}: {error.summary}"
        path, lineno, _ = item.location
        self.reprcrash = CrashLine(
            str(Path(item.config.rootpath, path)), (lineno or 0) + 1, self._headline
        )

    def toterminal(self, tw: _Writer) -> None:
        error = self.error
        tw.line(self._headline, red=True, bold=True)
        verdicts, parts = error.report()
        for verdict in verdicts:
            tw.line(verdict, red=True)
        for heading, text in parts:
            tw.sep("-", heading)
            lines = text.splitlines()
            # A traceback's last line is its exception; the collectives section has none.
            last = len(lines) - 1 if heading != "collectives" else -1
            for number, line in enumerate(lines):
                tw.line(line, red=number == last)
        if error.hint:
            tw.line()
            tw.line(error.hint, bold=True)
        if self._repro:
            tw.line()
            tw.line(self._repro)

    def __str__(self) -> str:
        # What pytest-xdist sends back from a worker, and what --tb=native falls back to.
        out = io.StringIO()
        self.toterminal(_PlainWriter(out))
        return out.getvalue().rstrip("\n")


class _PlainWriter:
    """A writer without markup, for ``str()``: separators 80 wide, as pytest draws them."""

    WIDTH = 80

    def __init__(self, out: io.StringIO) -> None:
        self._out = out

    def line(self, s: str = "", **markup: bool) -> None:
        self._out.write(s + "\n")

    def sep(self, sepchar: str, title: str | None = None, **markup: bool) -> None:
        if not title:
            self.line(sepchar * self.WIDTH)
            return
        fill = sepchar * max((self.WIDTH - len(title) - 2) // (2 * len(sepchar)), 1)
        self.line(f"{fill} {title} {fill}")


def add_output_sections(item: pytest.Item, outputs: dict[int, tuple[str, str]]) -> None:
    """Attach each rank's captured output to the report as pytest shows captured output."""
    for rank, (out, err) in sorted(outputs.items()):
        if out:
            item.add_report_section("call", f"rank {rank} stdout", out)
        if err:
            item.add_report_section("call", f"rank {rank} stderr", err)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> pytest.TestReport | None:
    # A plain implementation, not a wrapper: for every other test (and phase) this costs one
    # attribute check, and pytest builds the report itself.
    excinfo = call.excinfo
    if excinfo is None or not isinstance(excinfo.value, DistributedError):
        return None
    report = pytest.TestReport.from_item_and_call(item, call)
    if report.failed:
        longrepr: Any = DistributedFailureRepr(excinfo.value, item)
        report.longrepr = longrepr
    return report
