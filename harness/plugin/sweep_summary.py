"""How a sweep's cases read at the end of a run: verdicts that agree, summarised as ranges.

A sweep over every collective of every rank is dozens of cases; the terminal summary groups
those of one test with the same verdict into ranges (``kill at #1-#14 on any rank:
passed``), and lists each failing case with its kill point, the call site of its collective
and the command that runs it alone. Each case notes what the summary needs in its reports'
``user_properties`` (:data:`CASE`, as JSON), which pytest-xdist's workers send back to the
controller. This module is pure: no pytest, no torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from harness.protocol.failures import ranks_phrase

CASE = "dist_sweep_case"
"""The ``user_properties`` name under which a sweep's case notes itself (:meth:`Case.dumps`)."""

MAX_CASES = 500
"""The most cases a sweep over ``"all"`` may make: beyond, collection fails, saying how many."""

_VERDICT_WIDTH = 120  # a failure's message in a range line is cut to this


@dataclass(frozen=True)
class Case:
    """One case of a sweep, as the summary reads it.

    Attributes:
        test: The test's node id without the case's parameters.
        fault: How the fault reads without its rank and collective (``"kill"``, ``"kill
            after"``, ``"exit code=3"``), so the cases of one sweep share it.
        rank: The rank it acts on.
        at: The number of the collective it acts at (0: unknown).
        site: That collective and where it is issued (``"all_reduce at x.py:12"``,
            ``"all_reduce in backward (DDP) at x.py:30"``), as the clean run that counted
            the sweep found it, else as the case's run did; '' when unknown.
        verdict: ``"passed"``, ``"skipped"`` or ``"failed (RankError: ...)"``.
        repro: The command that runs the case alone.
        placed: How the fault names its collective where it names it by what it is
            (``"the 2nd all_reduce at x.py:12"``); '' where by its number.
    """

    test: str
    fault: str
    rank: int
    at: int
    site: str
    verdict: str
    repro: str
    placed: str = ""

    def dumps(self) -> str:
        """The case as JSON, for ``user_properties``."""
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, text: str) -> Case:
        """A case from :meth:`dumps`."""
        return cls(**json.loads(text))

    @property
    def point(self) -> str:
        """Its kill point: ``rank 1, #3 (all_reduce at x.py:12)``; ``rank 1, the 2nd
        all_reduce (#5: all_reduce at x.py:12)`` where the fault names it by what it is."""
        number = f"#{self.at}" if self.at else ""
        site = ": ".join(part for part in (number, self.site) if part)
        if self.placed:
            return f"rank {self.rank}, {self.placed}" + (f" ({site})" if site else "")
        return f"rank {self.rank}, {number}" + (f" ({self.site})" if self.site else "")


def verdict(failed: bool, skipped: bool, message: str) -> str:
    """A case's verdict as the summary groups it: ``failed (...)`` shows the first line of
    the failure's message, cut short."""
    if failed:
        first = message.strip().splitlines()[0] if message.strip() else "failed"
        if len(first) > _VERDICT_WIDTH:
            first = first[: _VERDICT_WIDTH - 3] + "..."
        return f"failed ({first})"
    return "skipped" if skipped else "passed"


def fault_label(kind: str, when: str = "before") -> str:
    """How a range line names a sweep's fault: ``kill``, ``kill after``, ``kill during``."""
    return f"{kind} {when}" if kind == "kill" and when != "before" else kind


def too_many(test: str, cases: int, per_rank: dict[int, int]) -> str:
    """The collection error of a sweep over ``"all"`` with more than :data:`MAX_CASES`
    cases, saying how many and how to sweep fewer."""
    counts = ", ".join(f"rank {rank}: {count}" for rank, count in sorted(per_rank.items()))
    return (
        f"{test}: a sweep over every collective would make {cases} cases (collectives of a "
        f"clean run: {counts}), more than {MAX_CASES}: sweep some of them, e.g. "
        "at=range(1, 50), or fewer ranks (ranks=[1])"
    )


def ranges(numbers: Iterable[int]) -> list[tuple[int, int]]:
    """Consecutive runs of ``numbers``, as ``(first, last)`` pairs, in order."""
    found: list[tuple[int, int]] = []
    for number in sorted(set(numbers)):
        if found and number == found[-1][1] + 1:
            found[-1] = (found[-1][0], number)
        else:
            found.append((number, number))
    return found


def _span(first: int, last: int) -> str:
    return f"#{first}" if first == last else f"#{first}-#{last}"


def _ranks(ranks: frozenset[int], every: frozenset[int]) -> str:
    if ranks == every and len(every) > 1:
        return "on any rank"
    return "on " + ranks_phrase(ranks)


def range_lines(cases: Sequence[Case]) -> list[str]:
    """The cases of one sweep (one test, one fault), summarised: collectives in a row whose
    cases end alike on the same ranks make one line (``kill at #1-#14 on any rank:
    passed``; "any rank": every rank the sweep covers); ordered by collective."""
    if not cases:
        return []
    every = frozenset(case.rank for case in cases)
    by_verdict: dict[str, dict[int, set[int]]] = {}
    label = cases[0].fault
    # "kill at #3" kills before collective #3; "kill after #3", "kill during #3" say when.
    at_word = " " if " " in label else " at "
    lines: list[tuple[int, int, str]] = []
    for case in cases:
        if case.placed:  # named by what it is: a line of its own
            text = f"{label}{at_word}{case.placed} on rank {case.rank}: {case.verdict}"
            lines.append((case.at, case.rank, text))
        else:
            by_verdict.setdefault(case.verdict, {}).setdefault(case.at, set()).add(case.rank)
    for verdict_text, ats in by_verdict.items():
        # Collectives in a row that end alike on the same ranks make one line.
        for first, last in ranges(ats):
            run = [first]
            for at in range(first + 1, last + 2):
                if at <= last and ats[at] == ats[run[0]]:
                    run.append(at)
                    continue
                ranks = frozenset(ats[run[0]])
                text = f"{label}{at_word}{_span(run[0], run[-1])} {_ranks(ranks, every)}"
                lines.append((run[0], min(ranks), f"{text}: {verdict_text}"))
                run = [at]
    return [text for _, _, text in sorted(lines)]


def summary(cases: Iterable[Case]) -> list[str]:
    """The terminal summary's lines for every sweep's cases: per test and fault, a heading,
    the range lines, then each failing case's kill point and command."""
    groups: dict[tuple[str, str], list[Case]] = {}
    for case in cases:
        groups.setdefault((case.test, case.fault), []).append(case)
    out = []
    for (test, fault), found in sorted(groups.items()):
        found.sort(key=lambda case: (case.rank, case.at))
        failed = [case for case in found if case.verdict.startswith("failed")]
        counted = f"{len(found)} case{'' if len(found) == 1 else 's'}"
        out.append(f"{test}: {fault}, {counted}, {len(failed)} failed")
        out += [f"  {line}" for line in range_lines(found)]
        for case in failed:
            out.append(f"  failed at {case.point}: {case.repro}")
    return out
