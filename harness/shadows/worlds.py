"""A test's shadow worlds, run from the controller: :func:`check`.

Each shadow world is one call of the host (:mod:`harness.shadows.host`) on the one rank of a
world without a process group. The first has the real world's size and must issue what the
real run issued (:func:`harness.shadows.check.unfaithful`); then each size asked for runs, in
order, until one shows a difference (:func:`harness.shadows.check.differences`), a rank
fails there, or every one agrees. For a size that shows a difference the smallest one that
does is searched for (:mod:`harness.shadows.search`), between the largest size known to agree
and it, each try stopping at the first rank that disagrees.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harness import compat
from harness.controller.world import World
from harness.errors import (
    DistributedError,
    RankCrash,
    RankError,
    ShadowMismatch,
    ShadowUnfaithful,
    WorldTimeout,
)
from harness.protocol.messages import OUTPUT_CAPTURE, CallOptions
from harness.protocol.traces import RankTrace
from harness.shadows import check as checks
from harness.shadows import entry
from harness.shadows.records import ShadowJob, ShadowRun, SimulatedRank
from harness.shadows.search import AGREES, DIFFERS, UNUSABLE, Search

SEARCH_BUDGET = 2
"""The simulated ranks a search for the smallest size may run, in shadow worlds of the size
that showed the difference."""


@dataclass
class Checked:
    """What a test's shadow worlds showed.

    Attributes:
        error: The test's failure (None: every size asked for agrees).
        checked: What each size run showed, in order (``"1024: agrees"``).
        seconds: How long the shadow worlds took, the search included.
        runs: The runs of every rank of a size, by size (for the trace folder).
    """

    error: DistributedError | None = None
    checked: list[str] = field(default_factory=list)
    seconds: float = 0.0
    runs: dict[int, ShadowRun] = field(default_factory=dict)

    @property
    def line(self) -> str:
        """The terminal line: ``shadow worlds of 2 (as the real run), 64, 1024 ranks
        agree (41.2 s)``."""
        return f"shadow worlds: {'; '.join(self.checked)} ({self.seconds:.1f} s)"


def check(
    world: World,
    job: ShadowJob,
    sizes: Sequence[int],
    real: Mapping[int, RankTrace | None],
    timeout: float,
) -> Checked:
    """Run ``job``'s shadow worlds on ``world``'s rank, for each of ``sizes``.

    Args:
        world: A world of one rank without a process group: the host.
        job: The shadow world of the real world's size (``job.size``).
        sizes: The sizes asked for, each at least the real world's.
        real: The real run's traces, by rank.
        timeout: The bound on them all, in seconds.
    """
    started = time.monotonic()
    found = Checked()
    host = _Host(world, job, started + timeout)
    try:
        _check(host, job, sizes, real, found)
    except DistributedError as exc:  # the host's own: it timed out, or died
        found.error = exc
    finally:
        found.seconds = time.monotonic() - started
    return found


def _check(
    host: _Host,
    job: ShadowJob,
    sizes: Sequence[int],
    real: Mapping[int, RankTrace | None],
    found: Checked,
) -> None:
    same = host.run(job.size)
    found.runs[job.size] = same
    if _ended(same, f"{job.size} (as the real run)", found):
        return
    differs = checks.unfaithful(real, same, compat.collective_hooks_available())
    if differs:
        found.error = ShadowUnfaithful(
            f"the shadow of the real world ({job.size} ranks) did not issue what the real run "
            f"did, so no larger shadow can say anything true of this test: {differs}. The "
            "body depends on what its collectives returned (in a shadow, what they would if "
            "every rank held this rank's data) or on what other ranks did (their files, the "
            "store); harness.shadow() tells it where it runs"
        )
        found.checked.append(f"{job.size} (as the real run): not faithful")
        return
    found.checked.append(f"{job.size} (as the real run): agrees")
    agrees = job.size
    for size in sorted(set(sizes) - {job.size}):
        shadow = host.run(size)
        found.runs[size] = shadow
        if _ended(shadow, str(size), found):
            if found.error is not None:
                return
            continue
        lines = checks.differences(shadow)
        if lines:
            found.error = _mismatch(host, shadow, lines, agrees)
            found.checked.append(f"{size}: differs")
            return
        found.checked.append(f"{size}: agrees")
        agrees = size


class _Host:
    """The host's world, and how a shadow world of a size is asked of it."""

    def __init__(self, world: World, job: ShadowJob, end: float) -> None:
        self.world, self.job, self.end = world, job, end

    def run(self, size: int, *, stop_at_difference: bool = False) -> ShadowRun:
        """The shadow world of ``size``.

        Raises:
            DistributedError: The host itself failed (the harness's own error).
        """
        job = dataclasses.replace(self.job, size=size, stop_at_difference=stop_at_difference)
        options = CallOptions(
            timeout=max(self.end - time.monotonic(), 0.1),
            output=OUTPUT_CAPTURE,
            seed=self.job.seed,
            name=f"the shadow world of {size} ranks",
            check_collectives=False,
        )
        outcome = self.world.call(entry.simulate, (job,), options=options)
        if outcome.error is not None:
            raise outcome.error
        if outcome.skip is not None:
            raise DistributedError(f"the shadow world's host skipped: {outcome.skip.reason}")
        values = outcome.values or []
        shadow = values[0] if values else None
        assert isinstance(shadow, ShadowRun)
        return shadow


def _ended(run: ShadowRun, size: str, found: Checked) -> bool:
    """Whether a rank of ``run`` skipped (noted) or failed (the test's failure, noted)."""
    failed = run.failed
    if failed is None:
        return False
    if failed.failure is None:
        found.checked.append(f"{size}: skipped ({failed.skip})")
    else:
        found.error = _failed(run, failed)
        found.checked.append(f"{size}: failed")
    return True


def _failed(run: ShadowRun, failed: SimulatedRank) -> DistributedError:
    """The test's failure for a rank that raised, died or did not finish in ``run``."""
    failure = failed.failure
    assert failure is not None
    what = failure.message if failure.exc_type == "WorldTimeout" else failure.what_happened()
    summary = f"in a shadow world of {run.size} ranks, rank {failed.rank} {what}"
    failures = {failed.rank: failure}
    if failure.exc_type == "RankCrash":
        return RankCrash(summary, failures)
    if failure.exc_type == "WorldTimeout":
        return WorldTimeout(summary, failures)
    return RankError(summary, failures)


def _mismatch(host: _Host, run: ShadowRun, lines: list[str], agrees: int) -> ShadowMismatch:
    """The test's failure for a shadow world whose ranks disagree, with the smallest size
    found that shows it."""
    outlier = checks.first_outlier(run)
    hint = None if outlier is None else outlier + 1
    search = Search(agrees, run.size, SEARCH_BUDGET * run.size, hint)
    left = ""
    while (size := search.next()) is not None:
        tried = host.run(size, stop_at_difference=True)
        if tried.failed is not None:  # it raised or skipped there: a size it cannot run at
            shown = UNUSABLE
        else:
            shown = DIFFERS if checks.differences(tried) else AGREES
        search.tell(size, shown, len(tried.ranks))
    if not search.closed:
        left = (
            f"; sizes {search.agrees + 1}-{search.differs - 1} not searched (the search "
            f"stops after {SEARCH_BUDGET * run.size} simulated ranks)"
        )
    unusable = sorted(s for s in search.unusable if search.agrees < s < search.differs)
    if unusable:
        left += f"; the body cannot run at {', '.join(map(str, unusable))} ranks"
    smallest = search.differs
    what = "groups" if lines[0].startswith("group creation") else "collectives"
    error = ShadowMismatch(
        f"in a shadow world of {run.size} ranks their {what} do not match, so a real world of "
        f"that size would hang or compute wrong results (the smallest shadow world that shows "
        f"it has {smallest} ranks; {search.agrees} ranks agree{left}): {lines[0]}",
        run.size,
        smallest,
    )
    error.verdicts = lines
    return error
