"""What a call left behind in its reused ranks, told: a warning, or a ``RankLeak``.

Each finding is one line of :mod:`harness.rank.leaks`.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.controller.outcome import Classified
from harness.errors import RankLeak
from harness.protocol.failures import RankFailure, ranks_phrase


def leak_report(leaks: Mapping[int, tuple[str, ...]], call: str) -> str:
    """The warning for what ``call`` (``"test test_x.py::test_a"``) left behind: each finding
    once, with the ranks it was found on (a body alike on every rank leaks alike)."""
    items = "; ".join(f"{ranks}: {line}" for line, ranks in _grouped(leaks))
    return f"{call} left behind in a reused rank: {items}"


def leak_error(outcome: Classified, call: str) -> Classified:
    """A successful outcome with ``leaks`` made a ``RankLeak`` (``leaks="error"``): the call,
    the ranks and the first finding, each rank's findings as its failure; not reusable
    (stopping the ranks ends what they leaked)."""
    leaks = outcome.leaks
    grouped = _grouped(leaks)
    line, ranks = grouped[0]
    also = f" (and {len(grouped) - 1} more, below)" if len(grouped) > 1 else ""
    summary = f"{call} left behind on {ranks}: {line}{also}; the ranks were stopped"
    failures = {
        rank: RankFailure(rank, "RankLeak", "; ".join(found), "".join(f"{f}\n" for f in found))
        for rank, found in sorted(leaks.items())
    }
    return Classified(
        error=RankLeak(summary, failures),
        outputs=outcome.outputs,
        reusable=False,
        notice=outcome.notice,
        leaks=leaks,
    )


def _grouped(leaks: Mapping[int, tuple[str, ...]]) -> list[tuple[str, str]]:
    """Each distinct finding with the ranks it was found on (``"ranks 0, 1"``), in order."""
    ranks_of: dict[str, list[int]] = {}
    for rank, found in sorted(leaks.items()):
        for line in found:
            ranks_of.setdefault(line, []).append(rank)
    return [(line, ranks_phrase(ranks)) for line, ranks in ranks_of.items()]
