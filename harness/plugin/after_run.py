"""What follows a distributed test's run on its ranks, before its verdict: a list of steps.

Each step takes what the run left (:class:`Ran`) and passes it on, changed where the step
changes the outcome (``verify=`` after a sweep's case fails it, as does a stale count). A
marked test (:mod:`harness.plugin.session`), a ``--dist-mptc`` case
(:mod:`harness.plugin.mptc`) and a ``@given`` test's last example
(:mod:`harness.plugin.properties`) go through the same steps, in the order of :data:`STEPS`;
a step that does not apply to a test passes it on as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import pytest

from harness.controller.outcome import Outcome
from harness.plugin import interrupts, report, sweep_cases, sweep_recount

if TYPE_CHECKING:
    from harness.controller.world import World
    from harness.plugin.item_settings import TestSettings, WorldShape
    from harness.plugin.leases import Holder
    from harness.plugin.trace_folders import TraceFolders
    from harness.protocol.messages import CallOptions
    from harness.protocol.pytest_calls import FixturePlan, TestRef


class Session(Protocol):
    """What the steps need of the plugin's session."""

    trace_folders: TraceFolders

    def fresh_world(self, shape: WorldShape, holder: Holder) -> World:
        """A new world of ``shape``, its GPUs leased for ``holder``."""

    def world(self, world_size: int, backend: str = "auto", init: bool = True) -> World:
        """The session's world of this size, backend and ``init``."""


@dataclass(frozen=True)
class Ran:
    """A test's run, as the steps after it see it.

    Attributes:
        item: The test.
        outcome: What its ranks did (the run whose verdict stands).
        world: The world it ran on (a ``--dist-mptc`` case's backend only names it).
        options: The options it was called with (its timeout and seed).
        holder: Whose worlds take GPUs, and until when they may wait for them.
        option: What a command that runs it again needs besides its id
            (``--dist-backend=gloo``, ``--dist-mptc``).
        note: What the runner's check on fresh processes found, for the repro line.
        failure: The test's failure where the runner made one (an order dependence).
        test: The marked test's settings; None for a ``--dist-mptc`` case (no marker).
        call_phase: Whether it ran in pytest's call phase (a ``@given`` test's example,
            which ran its ``verify=`` itself), not whole in the setup phase.
        seconds: How long the run took, as pytest's process measured it.
        call: What its ranks ran: the test and its rank-side fixtures (None: a
            ``--dist-mptc`` case or a ``@given`` test's example).
    """

    item: pytest.Function
    outcome: Outcome
    world: WorldShape
    options: CallOptions
    holder: Holder
    option: str
    note: str = ""
    failure: BaseException | None = None
    test: TestSettings | None = None
    call_phase: bool = False
    seconds: float = 0.0
    call: tuple[TestRef, FixturePlan] | None = None

    @property
    def described(self) -> str:
        """How the repro line names the world (``2 ranks, gloo``; ``2 ranks`` for a
        ``--dist-mptc`` case, whose tests make their own groups)."""
        if self.test is None:
            return f"{self.world.size} ranks"
        return f"{self.world.size} ranks, {self.world.backend}"


def recount(session: Session, ran: Ran) -> Ran:
    """A sweep case's run held against its count, counted again where the run contradicts
    it (see :func:`sweep_recount.after_case`)."""
    if ran.test is None:
        return ran
    outcome = sweep_recount.after_case(ran.item, ran.test, ran.outcome)
    return ran if outcome is ran.outcome else replace(ran, outcome=outcome)


def verify(session: Session, ran: Ran) -> Ran:
    """A sweep case's ``verify=``, on a fresh world (see :func:`sweep_cases.after_case`).

    Raises:
        pytest.fail.Exception: ``verify`` names an argument the test has no value for.
    """
    if ran.test is None or ran.call_phase:
        return ran
    outcome = sweep_cases.after_case(
        ran.item,
        ran.test,
        ran.outcome,
        lambda size: session.fresh_world(ran.world.sized(size), ran.holder),
        ran.options,
    )
    return ran if outcome is ran.outcome else replace(ran, outcome=outcome)


def shadow(session: Session, ran: Ran) -> Ran:
    """The test's shadow worlds, once its real run passed (:mod:`harness.shadows`): a
    difference there, or a failure, fails it; the terminal summary gets its line, and the
    trace folder the sequences of each shadow world."""
    test, outcome = ran.test, ran.outcome
    if test is None or not test.shadow or ran.call is None or ran.failure is not None:
        return ran
    if outcome.error is not None or outcome.skip is not None:
        return ran
    from harness.shadows import check, worlds  # only a test with shadow worlds loads them
    from harness.shadows.records import ShadowJob

    size = test.world_size
    job = ShadowJob(*ran.call, size, size, test.init, ran.options.seed, rank_timeout=test.timeout)
    host = session.world(1, "gloo", init=False)
    # A bound that only catches a hang (every rank's own, one after another, the search's
    # too), or what is left of pytest-timeout's limit.
    bound = test.timeout * (size + 3 * sum(test.shadow))
    with interrupts.taken_over(ran.item, bound) as deadline:
        checked = worlds.check(host, job, test.shadow, outcome.traces, deadline.seconds)
    ran.item.user_properties.append((report.SHADOWS, f"{ran.item.nodeid}: {checked.line}"))
    texts = {f"shadow-{size}.txt": check.sequences(run) for size, run in checked.runs.items()}
    session.trace_folders.write_texts(ran.item, texts, checked.error is not None)
    if checked.error is None:
        return ran
    return replace(ran, outcome=Outcome(error=checked.error, outputs=outcome.outputs))


def sweep_note(session: Session, ran: Ran) -> Ran:
    """A sweep's case noted for the terminal summary (:func:`sweep_cases.note`)."""
    if ran.test is not None:
        sweep_cases.note(ran.item, ran.test, ran.outcome, ran.option)
    return ran


def trace_folder(session: Session, ran: Ran) -> Ran:
    """The test's trace folder, where ``--dist-trace-dir`` gives it one."""
    session.trace_folders.write(ran.item, ran.outcome, ran.world.size, ran.world.backend)
    return ran


def report_sections(session: Session, ran: Ran) -> Ran:
    """The ranks' output and log records as report sections; for a marked test, whose
    ranks ran it whole in pytest's setup phase, the times of its phases there."""
    report.add_output_sections(ran.item, ran.outcome.outputs)
    if ran.test is not None and not ran.call_phase:
        report.keep_times(ran.item, _phase_times(ran))
    return ran


def repro(session: Session, ran: Ran) -> Ran:
    """A failure's last line: the command that runs the test alone."""
    if ran.outcome.error is not None:
        report.set_repro(ran.item, ran.note, ran.described, ran.option)
    return ran


STEPS: tuple[Callable[[Session, Ran], Ran], ...] = (
    recount,
    verify,
    shadow,
    sweep_note,
    trace_folder,
    report_sections,
    repro,
)
"""The steps, in order: the count first, then ``verify=`` and the shadow worlds, since what
the others show is their outcome."""


def after_run(session: Session, ran: Ran) -> Ran:
    """Take a test's run through :data:`STEPS`.

    Raises:
        pytest.fail.Exception: A step found the test's own mistake (see :func:`verify`).
    """
    for step in STEPS:
        ran = step(session, ran)
    return ran


def _phase_times(ran: Ran) -> tuple[float, float, float] | None:
    """The setup, call and teardown times of a test's run: the ranks' (see
    :func:`_rank_times`); where no rank said them (the ranks hung, or died) and the failure
    is its call's, the whole run's, as its call's: the phase that reports it."""
    said = _rank_times(ran.outcome)
    error = ran.outcome.error
    if said is None and error is not None:
        root = next(iter(error.failures.values()), None)
        if root is None or root.phase == "call":
            return (0.0, ran.seconds, 0.0)
    return said


def _rank_times(outcome: Outcome) -> tuple[float, float, float] | None:
    """The setup, call and teardown times of the slowest rank that said: one rank's, since
    each phase's longest of several ranks could add up to more than the test took."""
    said = [value for value in outcome.values or () if isinstance(value, tuple)]
    if outcome.error is not None:
        said += [f.times for f in outcome.error.failures.values() if f.times is not None]
    return max(said, key=sum, default=None)
