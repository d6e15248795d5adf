"""Order dependence on plain data: the runner that holds a reused world's verdict against fresh
processes, the search for the earlier test behind a difference, and how it reads.

A fake world stands in for a real one: it records the tests it is sent, and a test under
scrutiny ends one way on it iff its culprits ran there before it. No process is started.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.controller.outcome import Outcome
from harness.errors import OrderDependenceWarning, RankError
from harness.faults import kill
from harness.plugin import order, replay, report, runner
from harness.plugin.item_settings import WorldShape
from harness.plugin.leases import Holder
from harness.plugin.replay import FAILED, PASSED, SKIPPED
from harness.plugin.settings import Settings
from harness.protocol.messages import OUTPUT_CAPTURE, OUTPUT_PREFIX, CallOptions, Skipped

ROOT = Path("/proj")
SHAPE = WorldShape(2, "gloo", True)
HOLDER = Holder("test")


def _id(name: str) -> str:
    return f"tests/test_x.py::{name}"


def _noop() -> None:
    return None


class FakeWorld:
    """A world whose calls only record the test they run; it breaks after any of ``breaks``
    (a replayed test that fails)."""

    def __init__(self, breaks: Iterable[str] = ()) -> None:
        self.ran: list[str] = []
        self.options: list[CallOptions] = []
        self.breaks = set(breaks)
        self.broken = False
        self.generation = 0
        self.entered = self.exited = False

    def __enter__(self) -> FakeWorld:
        self.entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.exited = True

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], *, options: CallOptions) -> str:
        assert options.name is not None
        name = options.name.removeprefix("test ")
        self.ran.append(name)
        self.options.append(options)
        if name in self.breaks:
            self.broken = True
        return "outcome"


class Worlds:
    """Starts fresh :class:`FakeWorld` s (of any shape); the ``fail_at``-th (from 1) does
    not start."""

    def __init__(self, breaks: Iterable[str] = (), fail_at: int | None = None) -> None:
        self.made: list[FakeWorld] = []
        self.shapes: list[Any] = []
        self.breaks = [_id(name) for name in breaks]
        self.fail_at = fail_at

    def __call__(self, shape: Any = None, holder: Any = None) -> FakeWorld:
        self.shapes.append(shape)
        if self.fail_at is not None and len(self.shapes) == self.fail_at:
            raise RuntimeError("no free port")
        world = FakeWorld(self.breaks)
        self.made.append(world)
        return world

    def runs(self) -> list[list[str]]:
        """What each world ran, by test name."""
        return [[name.split("::")[-1] for name in world.ran] for world in self.made]


def _step(name: str) -> replay.Step:
    return replay.Step(_id(name), _noop, (), CallOptions(timeout=10.0, name=f"test {_id(name)}"))


def _steps(names: Iterable[str]) -> list[replay.Step]:
    return [_step(name) for name in names]


@dataclass
class FakeTest:
    """A test as the runner runs it (``runner.Runnable``): it ends ``verdict`` on a world
    where all its ``culprits`` ran before it, else ``otherwise``."""

    name: str
    culprits: tuple[str, ...] = ()
    verdict: str = FAILED
    otherwise: str = PASSED

    @property
    def step(self) -> replay.Step:
        return _step(self.name)

    def ends(self, world: FakeWorld) -> str:
        ran = set(world.ran)
        world.ran.append(_id(self.name))
        if self.culprits and all(_id(c) in ran for c in self.culprits):
            return self.verdict
        return self.otherwise

    def attempt(self, world: FakeWorld, fresh: bool) -> tuple[str, str]:
        verdict = self.ends(world)
        return verdict, f"{'fresh' if fresh else 'reused'} {verdict}"


HISTORY = "abcdefgh"


def _bisect(
    worlds: Worlds,
    *culprits: str,
    budget: int = 8,
    history: str = HISTORY,
    reused: str = FAILED,
) -> order.Culprit:
    other = PASSED if reused == FAILED else FAILED
    test = FakeTest("target", culprits, reused, other)
    return order.bisect(worlds, _steps(history), test.ends, reused, budget)


# ---------------------------------------------------------------- the search


@pytest.mark.parametrize(
    ("culprit", "runs"),
    [("a", 4), ("c", 4), ("d", 4), ("f", 4), ("g", 4), ("h", 3)],
)
def test_bisect_finds_the_one_earlier_test_behind_the_failure(culprit: str, runs: int) -> None:
    worlds = Worlds()
    assert _bisect(worlds, culprit) == order.Culprit((_id(culprit),), runs)
    assert len(worlds.made) == runs
    assert all(world.entered and world.exited for world in worlds.made)


def test_bisect_runs_tails_of_the_history_in_order_then_the_culprit_alone() -> None:
    worlds = Worlds()
    _bisect(worlds, "c")
    assert worlds.runs() == [
        ["e", "f", "g", "h", "target"],
        ["c", "d", "e", "f", "g", "h", "target"],
        ["d", "e", "f", "g", "h", "target"],
        ["c", "target"],
    ]


def test_bisect_halves_an_odd_history_rounding_down() -> None:
    worlds = Worlds()
    assert _bisect(worlds, "b", history="abcde") == order.Culprit((_id("b"),), 3)
    assert worlds.runs() == [
        ["c", "d", "e", "target"],
        ["b", "c", "d", "e", "target"],
        ["b", "target"],
    ]


def test_bisect_replays_earlier_tests_with_their_output_captured() -> None:
    worlds = Worlds()
    history = [
        replay.Step(
            _id(name), _noop, (), CallOptions(name=f"test {_id(name)}", output=OUTPUT_PREFIX)
        )
        for name in "ab"
    ]
    order.bisect(worlds, history, FakeTest("target", ("a",)).ends, FAILED, 8)
    assert {options.output for world in worlds.made for options in world.options} == {
        OUTPUT_CAPTURE
    }


def test_bisect_of_the_last_test_needs_no_separate_run_alone() -> None:
    worlds = Worlds()
    assert _bisect(worlds, "h") == order.Culprit((_id("h"),), 3)
    assert worlds.runs()[-1] == ["h", "target"]


def test_bisect_of_a_single_earlier_test_runs_it_once() -> None:
    worlds = Worlds()
    assert _bisect(worlds, "a", history="a") == order.Culprit((_id("a"),), 1)
    assert worlds.runs() == [["a", "target"]]


def test_bisect_works_for_a_test_that_passed_on_the_reused_world() -> None:
    assert _bisect(Worlds(), "e", reused=PASSED) == order.Culprit((_id("e"),), 4)


@pytest.mark.parametrize(
    ("budget", "tests", "why"),
    [
        (1, "abcd", "the search used its 1 fresh world, ini dist_bisect_runs"),
        (2, "cd", "the search used its 2 fresh worlds, ini dist_bisect_runs"),
        (3, "cdefgh", "the search used its 3 fresh worlds, ini dist_bisect_runs"),
    ],
)
def test_bisect_that_runs_out_of_fresh_worlds_names_the_tests_left(
    budget: int, tests: str, why: str
) -> None:
    worlds = Worlds()
    finding = _bisect(worlds, "c", budget=budget)
    assert finding == order.Culprit(tuple(_id(t) for t in tests), budget, why)
    assert len(worlds.made) == budget


def test_a_cause_that_needs_two_earlier_tests_is_not_pinned_on_one() -> None:
    worlds = Worlds()
    finding = _bisect(worlds, "a", "c", history="abcd")
    assert finding == order.Culprit(
        tuple(_id(t) for t in "abcd"), 3, "a alone before it does not reproduce it"
    )
    assert worlds.runs()[-1] == ["a", "target"]


def test_a_replayed_test_that_fails_stops_the_search() -> None:
    worlds = Worlds(breaks=["b"])
    finding = _bisect(worlds, "a", history="abcd")
    assert finding == order.Culprit(
        tuple(_id(t) for t in "abcd"),
        2,
        "b failed when it was run again on fresh processes",
    )
    assert worlds.runs()[-1] == ["b"]  # the test itself never ran on the broken world
    assert worlds.made[-1].exited


def test_a_fresh_world_that_does_not_start_stops_the_search() -> None:
    finding = _bisect(Worlds(fail_at=2), "c")
    assert finding == order.Culprit(
        tuple(_id(t) for t in HISTORY), 2, "a fresh world did not start (no free port)"
    )


# ---------------------------------------------------------------- replay


def test_a_step_calls_the_world_with_its_record_after_preparing() -> None:
    prepared: list[str] = []
    options = CallOptions(timeout=7.5, seed=42, name="test x", faults=(kill(1, 2),))
    step = replay.Step(_id("x"), _noop, (1, "y"), options, lambda: prepared.append("p"))
    world = FakeWorld()
    assert step.call(world) == "outcome"
    assert step.call(world, OUTPUT_CAPTURE) == "outcome"
    assert prepared == ["p", "p"]
    assert world.options == [
        options,
        CallOptions(7.5, OUTPUT_CAPTURE, 42, "test x", True, (kill(1, 2),)),
    ]


def test_on_fresh_silences_the_warnings_of_replayed_tests_and_stops_the_world() -> None:
    class Leaky(FakeWorld):
        def call(self, fn: Callable[..., Any], args: tuple[Any, ...], **kwargs: Any) -> str:
            warnings.warn("leaked a thread", stacklevel=1)
            return super().call(fn, args, **kwargs)

    worlds: list[Leaky] = []

    def new_world() -> Leaky:
        worlds.append(Leaky())
        return worlds[-1]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ran = replay.on_fresh(new_world, _steps("ab"), lambda world: list(world.ran))
    assert ran == [_id("a"), _id("b")]
    assert caught == []
    assert worlds[0].exited


def test_history_keeps_what_the_current_processes_ran() -> None:
    history, world = replay.History(), FakeWorld()
    assert history.before(world) == []
    a, b = _steps("ab")
    history.record(world, a)
    history.record(world, b)
    assert history.before(world) == [a, b]
    assert history.before(FakeWorld()) == []  # another world's


def test_history_forgets_a_rebuilt_or_broken_world() -> None:
    history, world = replay.History(), FakeWorld()
    a, b = _steps("ab")
    history.record(world, a)
    world.generation += 1  # rebuilt: fresh processes
    assert history.before(world) == []
    history.record(world, b)
    assert history.before(world) == [b]
    world.broken = True
    assert history.before(world) == []


def test_history_keeps_the_latest_tests_up_to_its_cap() -> None:
    history, world = replay.History(), FakeWorld()
    made = _steps(f"t{i}" for i in range(replay.HISTORY_CAP + 3))
    for step in made:
        history.record(world, step)
    assert history.before(world) == made[3:]


def test_how_a_call_ended() -> None:
    assert replay.verdict_of(Outcome(values=[1, 2])) == PASSED
    assert replay.verdict_of(Outcome(skip=Skipped("no gpu", "pytest", 0.0))) == SKIPPED
    assert replay.verdict_of(Outcome(error=RankError("boom"))) == FAILED
    both = Outcome(error=RankError("boom"), skip=Skipped("no gpu", "pytest", 0.0))
    assert replay.verdict_of(both) == FAILED


# ---------------------------------------------------------------- messages


def _config() -> SimpleNamespace:
    return SimpleNamespace(
        invocation_params=SimpleNamespace(dir=ROOT),
        rootpath=ROOT,
        getoption=lambda name, default=None: default,
        pluginmanager=SimpleNamespace(hasplugin=lambda name: False),
    )


def _item(name: str = "target") -> SimpleNamespace:
    return SimpleNamespace(
        nodeid=_id(name),
        config=_config(),
        location=("tests/test_x.py", 41, name),
        stash=pytest.Stash(),
        user_properties=[],
    )


def test_the_message_of_a_culprit_found() -> None:
    finding = order.Culprit((_id("test_a"),), 3)
    earlier = [_id("test_a"), _id("test_b")]
    assert order.message(_item(), earlier, FAILED, PASSED, finding, "--o") == (
        "target failed after test_a on a reused world and passes on fresh processes "
        "(found in 3 runs); run: pytest tests/test_x.py::test_a tests/test_x.py::target --o"
    )
    once = order.Culprit(finding.tests, 1)
    text = order.message(_item(), earlier, PASSED, FAILED, once, "--o")
    assert text.startswith("target passed after test_a on a reused world and fails on fresh ")
    assert "(found in 1 run)" in text


def test_the_message_without_a_search_lists_every_earlier_test() -> None:
    earlier = [_id("test_a"), _id("test_b")]
    assert order.message(_item(), earlier, SKIPPED, PASSED, None, "--o") == (
        "target was skipped on a reused world after 2 earlier tests (test_a, test_b) and "
        "passes on fresh processes; run: pytest tests/test_x.py::test_a tests/test_x.py::test_b "
        "tests/test_x.py::target --o"
    )
    one = order.message(_item(), earlier[:1], FAILED, SKIPPED, None, "--o")
    assert "after 1 earlier test (test_a) and is skipped on fresh processes" in one


def test_the_message_of_a_search_stopped_short_names_where_the_cause_is() -> None:
    earlier = [_id(f"test_{c}") for c in "abcdefg"]
    finding = order.Culprit(tuple(earlier[1:]), 2, "the search used its 2 fresh worlds")
    text = order.message(_item(), earlier, FAILED, PASSED, finding, "--o")
    assert text.startswith(
        "target failed on a reused world after 7 earlier tests and passes on fresh processes; "
        "no single earlier test found (the search used its 2 fresh worlds): the cause is among "
        "test_b, test_c, test_d, test_e, test_f, ...; run: pytest tests/test_x.py::test_b "
    )
    # The command runs the suspects, not test_a, then the test.
    assert "test_x.py::test_a " not in text
    assert text.endswith("tests/test_x.py::test_g tests/test_x.py::target --o")


def test_a_class_keeps_its_name_in_messages() -> None:
    item = _item("TestK::test_m[ws2]")
    text = order.message(item, ["tests/test_y.py::TestJ::test_n"], FAILED, PASSED, None, "--o")
    assert text.startswith("TestK::test_m[ws2] failed on a reused world after 1 earlier test")
    assert "(TestJ::test_n)" in text
    assert "'tests/test_x.py::TestK::test_m[ws2]'" in text  # quoted for the shell


# ---------------------------------------------------------------- the runner


class Session:
    """A runner on one reused world (a :class:`FakeWorld`) and fresh :class:`Worlds`."""

    def __init__(self, worlds: Worlds | None = None, **settings: Any) -> None:
        self.reused = FakeWorld()
        self.worlds = worlds or Worlds()
        self.shapes: list[tuple[Any, ...]] = []
        self.runner = runner.Runner(Settings(**settings), self._world, self.worlds)

    def _world(self, shape: tuple[Any, ...], holder: Any) -> FakeWorld:
        self.shapes.append(shape)
        return self.reused

    def run(self, test: FakeTest, isolate: bool = False) -> runner.Held[str]:
        return self.runner.run(_item(test.name), test, SHAPE, HOLDER, isolate, "--o")

    def earlier(self, names: str) -> None:
        """Run passing tests on the reused world first."""
        for name in names:
            assert self.run(FakeTest(name)).result.endswith(PASSED)


def _target(*culprits: str, verdict: str = FAILED, otherwise: str = PASSED) -> FakeTest:
    return FakeTest("target", culprits or ("c",), verdict, otherwise)


def test_tests_run_on_the_reused_world_of_their_shape() -> None:
    session = Session()
    session.earlier("ab")
    assert session.reused.ran == [_id("a"), _id("b")]
    assert session.shapes == [SHAPE, SHAPE]
    assert session.worlds.made == []


def test_an_isolated_test_runs_on_a_fresh_world_alone_and_is_not_history() -> None:
    session = Session(bisect_runs=0)
    session.earlier("a")
    isolated = session.run(FakeTest("b", ("a",)), isolate=True)
    assert isolated == runner.Held(f"fresh {PASSED}")
    assert session.worlds.shapes == [SHAPE]
    assert session.worlds.runs() == [["b"]]
    assert session.worlds.made[0].exited
    assert session.reused.ran == [_id("a")]
    # The next test's earlier tests are the reused world's: a, not b.
    with pytest.warns(OrderDependenceWarning) as caught:
        session.run(_target("a"))
    assert "after 1 earlier test (a) and passes" in str(caught[0].message)


@pytest.mark.parametrize(
    ("verdict", "settings"),
    [
        (PASSED, {}),  # only failures are confirmed
        (SKIPPED, {}),
        (FAILED, {"confirm": False}),
    ],
)
def test_nothing_is_checked_unless_the_settings_ask(verdict: str, settings: dict) -> None:
    session = Session(**settings)
    session.earlier("abcd")
    test = _target(verdict=verdict, otherwise=verdict)
    assert session.run(test) == runner.Held(f"reused {verdict}")
    assert session.worlds.made == []


def test_a_test_that_ran_first_on_its_world_is_not_checked() -> None:
    session = Session(verify=True)
    assert session.run(_target(otherwise=FAILED)) == runner.Held(f"reused {FAILED}")
    assert session.worlds.made == []


def test_a_failure_fresh_processes_confirm_keeps_the_fresh_account() -> None:
    session = Session()
    session.earlier("abcd")
    checked = session.run(_target(otherwise=FAILED))
    assert checked == runner.Held(f"fresh {FAILED}", "confirmed on fresh processes; ")
    assert session.worlds.runs() == [["target"]]


def test_verify_checks_passing_tests_too_and_notes_whether_they_agree() -> None:
    session = Session(verify=True)
    session.earlier("ab")
    item = _item()
    same = session.runner.run(item, FakeTest("target"), SHAPE, HOLDER, False, "--o")
    assert same.note == "confirmed on fresh processes; "
    assert item.user_properties == [(report.VERIFIED, "same")]
    assert len(session.worlds.made) == 2  # b checked after a, the target after both


def test_a_fresh_world_that_does_not_start_leaves_the_verdict_unconfirmed() -> None:
    session = Session(Worlds(fail_at=1))
    session.earlier("abcd")
    assert session.run(_target()) == runner.Held(
        f"reused {FAILED}", "not confirmed on fresh processes (no free port); "
    )


def test_an_order_dependence_under_fail_fails_the_test_naming_the_culprit() -> None:
    session = Session(order_dependent="fail")
    session.earlier("abcd")
    checked = session.run(_target())
    assert checked.result == f"fresh {PASSED}"
    assert isinstance(checked.failure, pytest.fail.Exception)
    assert not checked.failure.pytrace
    assert checked.failure.msg == (
        "target failed after c on a reused world and passes on fresh processes (found in 3 "
        "runs); run: pytest tests/test_x.py::c tests/test_x.py::target --o"
    )
    assert session.worlds.runs() == [
        ["target"],  # the check
        ["c", "d", "target"],  # the search
        ["d", "target"],
        ["c", "target"],
    ]


def test_an_order_dependence_warns_at_the_test_by_default() -> None:
    session = Session()
    session.earlier("abcd")
    with pytest.warns(OrderDependenceWarning) as caught:
        checked = session.run(_target())
    assert checked == runner.Held(f"fresh {PASSED}")
    (found,) = caught
    assert (found.filename, found.lineno) == (str(ROOT / "tests/test_x.py"), 42)
    assert str(found.message).startswith("target failed after c on a reused world")


def test_an_order_dependence_warning_as_an_error_fails_the_test() -> None:
    session = Session()
    session.earlier("abcd")
    with warnings.catch_warnings():
        warnings.simplefilter("error", OrderDependenceWarning)
        checked = session.run(_target())
    assert isinstance(checked.failure, pytest.fail.Exception)
    assert checked.failure.msg.startswith("OrderDependenceWarning: target failed after c")


def test_a_test_that_fails_only_on_fresh_processes_warns_even_under_fail() -> None:
    # The fresh verdict (a failure) stands: the test fails anyway, the warning says why.
    session = Session(verify=True, order_dependent="fail")
    session.earlier("abcd")
    with pytest.warns(OrderDependenceWarning, match="target passed after c"):
        checked = session.run(_target(verdict=PASSED, otherwise=FAILED))
    assert checked == runner.Held(f"fresh {FAILED}")


def test_no_search_without_fresh_worlds_to_spend() -> None:
    session = Session(bisect_runs=0)
    session.earlier("abcd")
    with pytest.warns(OrderDependenceWarning) as caught:
        session.run(_target())
    assert len(session.worlds.made) == 1
    assert "after 4 earlier tests (a, b, c, d)" in str(caught[0].message)


def test_the_search_covers_only_what_the_current_processes_ran() -> None:
    session = Session(bisect_runs=0)
    session.earlier("ab")
    session.reused.generation += 1  # the world was rebuilt: a and b ran on other processes
    session.earlier("cd")
    with pytest.warns(OrderDependenceWarning) as caught:
        session.run(_target())
    assert "after 2 earlier tests (c, d)" in str(caught[0].message)
