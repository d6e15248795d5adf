"""The verdict lines tests compare: the text of each of ``verdicts.findings``."""

from __future__ import annotations

from collections.abc import Mapping

from harness.controller import verdicts
from harness.protocol.traces import RankTrace


def verdict_lines(
    traces: Mapping[int, RankTrace | None],
    states: Mapping[int, str],
    world_size: int,
    *,
    until_raised: bool = False,
) -> list[str]:
    """The text of each finding, in order."""
    found = verdicts.findings(traces, states, world_size, until_raised=until_raised)
    return [finding.text for finding in found]
