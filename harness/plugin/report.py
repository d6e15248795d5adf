"""Where a distributed failure is turned into a pytest report.

Not a traceback through the harness's code: the report's first line says which rank failed
and how; then come the verdicts on the ranks' collectives where they disagree, each failing
rank's traceback (root cause first) and a ``collectives`` section, as
``DistributedError.report`` lays them out, and last the command that reproduces the failure
(:func:`harness.plugin.order.repro`). The ranks' captured output becomes report sections.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.errors import DistributedError
from harness.plugin import order


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
        self._repro = order.repro(item)
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
