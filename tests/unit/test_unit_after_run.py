"""The steps after a distributed test's run (``run_item``'s and ``--dist-mptc``'s), on fake
items and a fake session: what each step does, and leaves alone, for a marked test and for a
``--dist-mptc`` case."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.controller.outcome import Outcome
from harness.errors import RankError
from harness.faults import kill
from harness.plugin import after_run, item_state, session
from harness.plugin.interrupts import Deadline
from harness.plugin.item_settings import TestSettings, WorldShape
from harness.plugin.leases import Holder
from harness.plugin.marker import CleanRun, check_verify
from harness.plugin.sweep_summary import CASE
from harness.protocol.failures import RankFailure
from harness.protocol.messages import OUTPUT_CAPTURE, CallOptions, Skipped

ROOT = Path("/proj")
NODEID = "tests/test_x.py::test_a[kill-r1-at2]"


class FakeItem:
    """What the steps use of a test item."""

    def __init__(self) -> None:
        self.nodeid = NODEID
        self.name = "test_a[kill-r1-at2]"
        self.config = SimpleNamespace(
            invocation_params=SimpleNamespace(dir=ROOT),
            rootpath=ROOT,
            getoption=lambda name, default=None: default,
            pluginmanager=SimpleNamespace(hasplugin=lambda name: False),
            stash=pytest.Stash(),
        )
        self.stash = pytest.Stash()
        self.sections: list[tuple[str, str, str]] = []
        self.user_properties: list[tuple[str, object]] = []
        self.funcargs: dict[str, Any] = {}

    def add_report_section(self, when: str, key: str, content: str) -> None:
        self.sections.append((when, key, content))


class FakeSession:
    """The session as the steps see it: trace folders written, fresh worlds asked for."""

    def __init__(self) -> None:
        self.folders: list[tuple[str, int, str]] = []
        self.worlds: list[tuple[WorldShape, Holder]] = []
        self.trace_folders = SimpleNamespace(write=self._write)

    def _write(self, item: FakeItem, outcome: Outcome, size: int, backend: str) -> None:
        self.folders.append((item.nodeid, size, backend))

    def fresh_world(self, shape: WorldShape, holder: Holder) -> Any:
        self.worlds.append((shape, holder))
        raise AssertionError("no step here needs a world")


def verify_nothing() -> None:
    """A module-level ``verify=`` (never run here)."""


WORLD = WorldShape(2, "gloo")
OPTIONS = CallOptions(30.0, OUTPUT_CAPTURE)


def _test(case: object = None, verify: Any = None) -> TestSettings:
    return TestSettings(
        world=WORLD,
        backend="gloo",
        isolate=False,
        gpus_per_rank=None,
        call=OPTIONS,
        case=case,  # type: ignore[arg-type]
        verify=check_verify(verify),
    )


def _ran(outcome: Outcome, test: TestSettings | None, note: str = "") -> after_run.Ran:
    return after_run.Ran(
        FakeItem(),  # type: ignore[arg-type]
        outcome,
        WORLD,
        OPTIONS,
        Holder(NODEID),
        "--dist-backend=gloo" if test is not None else "--dist-mptc",
        note,
        test=test,
    )


def _failed() -> Outcome:
    failure = RankFailure(1, "RuntimeError", "boom", "Traceback ...\nRuntimeError: boom\n")
    return Outcome(error=RankError("rank 1 raised RuntimeError: boom", {1: failure}))


def test_the_steps_hold_the_count_then_run_verify_first() -> None:
    assert after_run.STEPS[:2] == (after_run.recount, after_run.verify)
    assert after_run.STEPS[2] is after_run.shadow  # what the later steps show is its outcome
    assert set(after_run.STEPS) == {
        after_run.recount,
        after_run.verify,
        after_run.shadow,
        after_run.sweep_note,
        after_run.trace_folder,
        after_run.report_sections,
        after_run.repro,
    }


@pytest.mark.parametrize(
    "ran",
    [
        _ran(Outcome(values=[None, None]), None),  # a --dist-mptc case: no marker
        _ran(Outcome(values=[None, None]), _test()),  # no verify=
        _ran(_failed(), _test(kill(rank=1, at=2), verify_nothing)),  # the case failed
        _ran(Outcome(values=[None, None]), _test(CleanRun(1), verify_nothing)),  # a count
    ],
)
def test_verify_passes_a_run_on_where_it_has_nothing_to_run(ran: after_run.Ran) -> None:
    session = FakeSession()
    assert after_run.verify(session, ran) is ran
    assert session.worlds == []


@pytest.mark.parametrize(
    "ran",
    [
        _ran(Outcome(values=[None, None]), None),  # a --dist-mptc case: no marker
        _ran(Outcome(values=[None, None]), _test()),  # no shadow=
        _ran(_failed(), replace(_test(), shadow=(8,))),  # the real run failed
    ],
)
def test_shadow_worlds_pass_a_run_on_where_they_have_nothing_to_run(ran: after_run.Ran) -> None:
    session = FakeSession()
    assert after_run.shadow(session, ran) is ran
    assert session.worlds == []
    assert ran.item.user_properties == []


def test_a_sweep_case_is_noted_for_the_summary_and_nothing_else_is() -> None:
    session = FakeSession()
    plain = _ran(Outcome(values=[None, None]), _test())
    after_run.sweep_note(session, plain)
    assert plain.item.user_properties == []
    case = _ran(_failed(), _test(kill(rank=1, at=2)))
    after_run.sweep_note(session, case)
    [(name, value)] = case.item.user_properties
    noted = json.loads(str(value))
    assert name == CASE
    assert (noted["rank"], noted["at"], noted["test"]) == (1, 2, "tests/test_x.py::test_a")
    assert "RuntimeError: boom" in json.dumps(noted)


def test_every_run_gets_its_trace_folder_step_under_its_world() -> None:
    session = FakeSession()
    after_run.trace_folder(session, _ran(Outcome(values=[None, None]), _test()))
    after_run.trace_folder(session, _ran(_failed(), None))
    assert session.folders == [(NODEID, 2, "gloo"), (NODEID, 2, "gloo")]


def test_output_becomes_sections_and_only_a_marked_tests_times_move() -> None:
    outcome = Outcome(values=[(0.1, 0.2, 0.3), (0.1, 0.5, 0.1)], outputs={1: ("hi\n", "")})
    marked = _ran(outcome, _test())
    after_run.report_sections(FakeSession(), marked)
    assert marked.item.sections == [("call", "rank 1 stdout", "hi\n")]
    assert item_state.of(marked.item).moved == (0.5, 0.1)
    case = _ran(outcome, None)  # its ranks ran in pytest's call phase, not its setup
    after_run.report_sections(FakeSession(), case)
    assert item_state.of(case.item).moved is None


def test_a_failure_ends_with_its_repro_line_and_a_pass_has_none() -> None:
    passed = _ran(Outcome(values=[None, None]), _test())
    after_run.repro(FakeSession(), passed)
    assert item_state.of(passed.item).repro == ""
    failed = _ran(_failed(), _test(), note="confirmed on fresh processes; ")
    after_run.repro(FakeSession(), failed)
    assert item_state.of(failed.item).repro == (
        "confirmed on fresh processes; run (2 ranks, gloo): "
        "pytest 'tests/test_x.py::test_a[kill-r1-at2]' --dist-backend=gloo"
    )
    case = _ran(_failed(), None)
    after_run.repro(FakeSession(), case)
    assert item_state.of(case.item).repro == (
        "run (2 ranks): pytest 'tests/test_x.py::test_a[kill-r1-at2]' --dist-mptc"
    )


def test_after_run_takes_a_run_through_every_step() -> None:
    session = FakeSession()
    ran = _ran(_failed(), _test(kill(rank=1, at=2)))
    assert after_run.after_run(session, ran) is ran
    assert session.folders == [(NODEID, 2, "gloo")]
    assert [name for name, _ in ran.item.user_properties] == [CASE]
    assert item_state.of(ran.item).repro.startswith("run (2 ranks, gloo): ")


# ---------------------------------------------------------------- settle


def _settled(outcome: Outcome, failure: BaseException | None = None) -> FakeItem:
    ran = replace(_ran(outcome, _test()), failure=failure)
    ran.item.addfinalizer = ran.item.sections.append  # type: ignore[attr-defined]
    session._settle(ran, Deadline(30.0))
    return ran.item  # type: ignore[return-value]


def _with_phase(phase: str) -> Outcome:
    failure = RankFailure(0, "ValueError", "bad", "Traceback ...\nValueError: bad\n", phase)
    return Outcome(error=RankError("rank 0 raised ValueError: bad", {0: failure}))


def test_a_pass_keeps_nothing_for_the_call_phase() -> None:
    assert item_state.of(_settled(Outcome(values=[None, None]))).call is None


def test_a_call_phase_failure_is_kept_for_that_phase() -> None:
    outcome = _with_phase("call")
    assert item_state.of(_settled(outcome)).call is outcome.error


def test_a_setup_failure_raises_now_and_a_teardown_one_at_teardown() -> None:
    outcome = _with_phase("setup")
    with pytest.raises(RankError) as info:
        _settled(outcome)
    assert info.value is outcome.error
    item = _settled(_with_phase("teardown"))
    assert item_state.of(item).call is None
    [finalizer] = item.sections
    with pytest.raises(RankError):
        finalizer()  # type: ignore[operator]


def test_a_skip_is_raised_in_setup_or_kept_for_the_call_with_its_site() -> None:
    site = ("/proj/tests/test_x.py", 30)
    with pytest.raises(pytest.skip.Exception, match="no GPU"):
        _settled(Outcome(skip=Skipped("no GPU", "pytest", 0.0, phase="setup", site=site)))
    item = _settled(Outcome(skip=Skipped("later", "pytest", 0.0, site=site)))
    assert (item_state.of(item).call, item_state.of(item).skip_site) == ("later", site)


def test_the_runners_failure_is_kept_unless_the_ranks_say_more() -> None:
    order = pytest.fail.Exception("order dependence", pytrace=False)
    assert item_state.of(_settled(Outcome(values=[None]), order)).call is order
    outcome = _with_phase("call")
    assert item_state.of(_settled(outcome, order)).call is outcome.error
