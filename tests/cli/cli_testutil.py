"""Reading the report of ``python -m harness check``, for the command line's tests."""

from __future__ import annotations

import re

TABLE_ROW = re.compile(
    r"^(?P<name>\S.*?)\s+\| (?P<status>ok|unsupported: .+?|n/a: .+?|FAIL: .+?)\s+\|\s+"
    r"(?P<latency>\d+\.\d{3} ms|-)$"
)


def table(stdout: str) -> dict[str, tuple[str, str]]:
    """The report's table rows: ``{collective: (result, latency)}``, in report order."""
    rows = {}
    for line in stdout.splitlines():
        match = TABLE_ROW.match(line)
        if match:
            rows[match["name"].strip()] = (match["status"], match["latency"])
    return rows


def working(status: str) -> bool:
    """Whether a row's result is no failure: ``ok``, or a collective that this torch's
    backend does not implement (Gloo lacks ``all_to_all`` before torch 2.11), which the
    check reports as ``unsupported`` whatever else happens in the run."""
    return status == "ok" or status.startswith("unsupported: ")
