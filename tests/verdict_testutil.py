"""What the verdict tests share: a group's history of ops, and the text of each of
``verdicts.findings``."""

from __future__ import annotations

from array import array
from collections.abc import Mapping

from harness.controller import verdicts
from harness.protocol.traces import DEFAULT_GROUP, GroupHistory, Op, RankTrace


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


def history(
    ops: list[Op],
    group: str = DEFAULT_GROUP,
    ranks: tuple[int, ...] | None = None,
    *,
    lines: list[int] | None = None,
    raised: int = 0,
) -> GroupHistory:
    """A group's history of ``ops``, called at ``/src/test_x.py`` (line 10 + n unless
    ``lines``)."""
    lines = lines or [10 + n for n in range(len(ops))]
    distinct_ops = list(dict.fromkeys(ops))
    places = list(dict.fromkeys(("/src/test_x.py", line) for line in lines))
    return GroupHistory(
        group,
        ranks,
        len(ops),
        tuple(distinct_ops),
        array("I", [distinct_ops.index(op) for op in ops]).tobytes(),
        tuple(places),
        array("I", [places.index(("/src/test_x.py", line)) for line in lines]).tobytes(),
        raised,
    )
