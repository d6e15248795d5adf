"""Where a distributed failure is turned into a pytest report.

pytest would show a ``DistributedError`` as a traceback through the harness's own code. The
report instead shows what a reader needs: one line that says which rank failed and how,
then each failing rank's traceback under a ``rank N`` heading, root cause first. The ranks'
captured output is attached as report sections ``rank N stdout`` / ``rank N stderr``.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest
from _pytest._code.code import ReprFileLocation, TerminalRepr
from _pytest._io import TerminalWriter

from harness._errors import DistributedError


class DistributedFailureRepr(TerminalRepr):
    """The long representation of a failed distributed test."""

    def __init__(self, error: DistributedError, item: pytest.Item) -> None:
        self.error = error
        headline = f"{type(error).__name__}: {error.summary}"
        path, lineno, _ = item.location
        # reprcrash is what -rA, --tb=line and the short summary show in one line.
        self.reprcrash = ReprFileLocation(
            str(Path(item.config.rootpath, path)), (lineno or 0) + 1, headline
        )
        self._headline = headline

    def toterminal(self, tw: TerminalWriter) -> None:
        tw.line(self._headline, red=True, bold=True)
        root_first = self.error._root_cause_first and len(self.error.failures) > 1
        for index, failure in enumerate(self.error.failures.values()):
            note = " (root cause)" if index == 0 and root_first else ""
            tw.sep("-", f"rank {failure.rank}{note}")
            lines = failure.render().splitlines()
            for number, line in enumerate(lines):
                tw.line(line, red=number == len(lines) - 1)


def add_output_sections(item: pytest.Item, outputs: dict[int, tuple[str, str]]) -> None:
    """Attach each rank's captured output to the report as pytest shows captured output."""
    for rank, (out, err) in sorted(outputs.items()):
        if out:
            item.add_report_section("call", f"rank {rank} stdout", out)
        if err:
            item.add_report_section("call", f"rank {rank} stderr", err)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    excinfo = call.excinfo
    if report.failed and excinfo is not None and isinstance(excinfo.value, DistributedError):
        report.longrepr = DistributedFailureRepr(excinfo.value, item)
    return report
