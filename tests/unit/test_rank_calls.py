"""Parts of a call's run in a rank, tested in this process: where a fault is placed and what
it does when it fires (``inject``, with stand-in collectives), the threads a call leaves
alive (``leaks``), and the cache of wider-scoped fixtures (``fixtures``)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from harness import faults
from harness.protocol.pytest_calls import ARG_FIXTURE, Arg, FixturePlan, FunctionRef, RankFixture
from harness.protocol.traces import Op
from harness.rank import fixtures, inject, leaks
from harness.rank.recording.records import Group, Record

# ---------------------------------------------------------------- inject


class _Fired:
    def __init__(self) -> None:
        self.seen: list[tuple[int, str, bool]] = []
        self.targets: list[inject.Target] = []

    def __call__(self, index: int, what: str, ends: bool, target: inject.Target) -> None:
        self.seen.append((index, what, ends))
        self.targets.append(target)


def _no_exit(code: int) -> None:
    raise AssertionError(f"exit({code}) called")


def _record(
    ranks: tuple[int, ...] | None,
    seq: int,
    op: str = "all_reduce",
    place: tuple[str, int] = ("/src/train.py", 3),
    origin: str = "",
) -> Record:
    """A collective as the recorder notes it: ``seq`` on the group of ``ranks``."""
    return Record(Group("", ranks, None), seq, Op(op, f"{op}()", f"{op}()", origin=origin), place)


def test_a_plan_holds_only_this_rank_faults() -> None:
    placed = (faults.delay(0, 1, 0.0), faults.delay(1, 2, 0.0, group=(0, 1)))
    assert not inject.Plan(placed[:1], 1, _Fired(), _no_exit)
    plan = inject.Plan(placed, 1, _Fired(), _no_exit)
    assert plan
    assert plan.take(_record(None, 2)) is None  # placed on the group (0, 1), not the default one
    assert plan.take(_record((1, 0), 1)) is None
    assert plan.take(_record((1, 0), 0)) is None  # a point-to-point op has no number
    taken = plan.take(_record((1, 0), 2))
    assert taken is not None
    assert taken[0] == 1
    assert plan.take(_record((0, 1), 2)) is None  # once


def test_a_fault_placed_by_what_its_collective_is_counts_its_matches() -> None:
    second = faults.Collective("all_reduce", 2, site="train.py:3")
    placed = (faults.delay(0, second, 0.0), faults.delay(0, faults.Collective(site="b.py"), 0.0))
    plan = inject.Plan(placed, 0, _Fired(), _no_exit)
    assert plan.take(_record(None, 1)) is None  # the 1st all_reduce at train.py:3
    assert plan.take(_record(None, 2, "broadcast")) is None
    assert plan.take(_record(None, 3, place=("/src/train.py", 4))) is None  # another line
    assert plan.take(_record(None, 4, place=("/src/other/b.py", 9))) == (1, placed[1])
    assert plan.take(_record((0, 1), 5)) is None  # another group
    assert plan.take(_record(None, 0)) is None  # a point-to-point op
    assert plan.take(_record(None, 6)) == (0, placed[0])
    assert not plan


def test_an_unfired_strict_fault_is_listed_with_the_counts() -> None:
    placed = (faults.delay(0, 3, 0.0), faults.delay(0, 1, 0.0, strict=False))
    plan = inject.Plan(placed, 0, _Fired(), _no_exit)
    assert plan.unfired({None: 2}, 0) == (
        f"fault {placed[0]} never fired: rank 0 made 2 collectives on the default group",
    )
    assert plan.take(_record(None, 3)) is not None
    assert plan.unfired({None: 3}, 0) == ()


def test_an_unfired_fault_placed_by_what_it_is_says_what_matched() -> None:
    third = faults.delay(0, faults.Collective("all_reduce", 3, site="train.py:3"), 0.0)
    plan = inject.Plan((third,), 0, _Fired(), _no_exit)
    plan.take(_record(None, 1))
    plan.take(_record(None, 2))
    assert plan.unfired({None: 2}, 0) == (
        f"fault {third} never fired: rank 0 issued 2 all_reduce at train.py:3 on the default group",
    )


def test_two_faults_at_one_collective_the_later_one_is_unfired_saying_so() -> None:
    placed = (faults.delay(0, 2, 0.0), faults.delay(0, faults.Collective("all_reduce", 2), 0.0))
    plan = inject.Plan(placed, 0, _Fired(), _no_exit)
    plan.take(_record(None, 1))
    assert plan.take(_record(None, 2)) == (0, placed[0])
    assert plan  # the other is kept, to say why it never fired
    assert plan.unfired({None: 2}, 0) == (
        f"fault {placed[1]} never fired: {placed[0]} acted at the same collective, "
        "collective #2 (all_reduce at train.py:3) on the default group",
    )


def test_an_error_fault_raises_and_is_known_as_the_cause() -> None:
    fired = _Fired()
    plan = inject.Plan((faults.error(0, 1, ValueError("lost")),), 0, fired, _no_exit)
    record = _record(None, 1)
    taken = plan.take(record)
    assert taken is not None
    with pytest.raises(ValueError, match="lost") as info:
        plan.act(taken, record, _never, {})
    assert plan.caused(info.value)
    assert not plan.caused(ValueError("lost"))
    try:
        raise RuntimeError("while handling") from info.value
    except RuntimeError as later:
        assert plan.caused(later)
    assert fired.seen == [
        (
            0,
            "raised ValueError('lost') at collective #1 (all_reduce at train.py:3) on the "
            "default group",
            False,
        )
    ]
    assert fired.targets == [inject.Target(1, "all_reduce", "train.py:3", "")]


def test_a_fault_line_names_the_origin_and_leaves_out_an_unknown_site() -> None:
    fired = _Fired()
    plan = inject.Plan((faults.delay(0, 1, 0.0), faults.delay(0, 2, 0.0)), 0, fired, _no_exit)
    for record in (
        _record(None, 1, place=("/src/train.py", 40), origin="backward (DDP)"),
        _record(None, 2, "barrier", place=("?", 0)),
    ):
        taken = plan.take(record)
        assert taken is not None
        plan.act(taken, record, lambda: None, {})
    assert [what for _, what, _ in fired.seen] == [
        "was delayed 0 s before collective #1 (all_reduce in backward (DDP) at train.py:40) "
        "on the default group",
        "was delayed 0 s before collective #2 (barrier) on the default group",
    ]


def test_a_delay_fires_then_calls_the_collective() -> None:
    fired = _Fired()
    plan = inject.Plan((faults.delay(0, 1, 0.0),), 0, fired, _no_exit)
    record = _record(None, 1, "barrier")
    taken = plan.take(record)
    assert taken is not None
    assert plan.act(taken, record, lambda: "ran", {}) == "ran"
    assert fired.seen == [
        (
            0,
            "was delayed 0 s before collective #1 (barrier at train.py:3) on the default group",
            False,
        )
    ]


def test_a_corrupt_fault_changes_the_input_first() -> None:
    import torch

    fired = _Fired()
    plan = inject.Plan((faults.corrupt(0, 1, _zero),), 0, fired, _no_exit)
    tensor = torch.ones(2)
    record = _record(None, 1)
    taken = plan.take(record)
    assert taken is not None
    result = plan.act(taken, record, lambda: tensor.sum().item(), {"tensor": tensor})
    assert result == 0.0
    assert fired.seen[0][2] is False


def test_an_exit_fault_fires_then_exits() -> None:
    fired, codes = _Fired(), []

    class _Exited(Exception):
        pass

    def exit_(code: int) -> None:
        codes.append(code)
        raise _Exited

    plan = inject.Plan((faults.exit(0, 1, 3),), 0, fired, exit_)
    record = _record(None, 1, "barrier")
    taken = plan.take(record)
    assert taken is not None
    with pytest.raises(_Exited):
        plan.act(taken, record, _never, {})
    assert codes == [3]
    assert fired.seen[0][2] is True


def test_bound_names_the_arguments() -> None:
    assert inject.bound(_collective, (1,), {"op": 2}) == {"tensor": 1, "op": 2}
    assert inject.bound(_collective, (1, 2, 3), {}) == {}


def _collective(tensor: Any, op: Any = None) -> None:
    pass


def _never() -> Any:
    raise AssertionError("the collective ran")


def _zero(tensor: Any) -> None:
    tensor.zero_()


# ---------------------------------------------------------------- leaks


def test_a_thread_left_alive_is_found_a_joined_one_is_not() -> None:
    release = threading.Event()
    watch = leaks.Watch(own="")
    with watch.threads():
        joined = threading.Thread(target=lambda: None, name="harness-t-joined")
        joined.start()
        joined.join()
        alive = threading.Thread(target=release.wait, name="harness-t-alive", daemon=True)
        alive.start()
    try:
        found = [line for line in watch.findings() if line.startswith("thread ")]
    finally:
        release.set()
        alive.join()
    assert len(found) == 1
    assert found[0].startswith("thread 'harness-t-alive' started at ")
    assert "test_rank_calls.py:" in found[0]
    assert found[0].endswith(" is still alive")


def test_lasting_threads_and_disabled_watches_find_nothing() -> None:
    release = threading.Event()
    watch = leaks.Watch(own="")
    with watch.threads(), watch.lasting():
        lasting = threading.Thread(target=release.wait, daemon=True)
        lasting.start()
    try:
        assert not [line for line in watch.findings() if line.startswith("thread ")]
        off = leaks.Watch(enabled=False)
        with off.threads():
            pass
        assert off.findings() == ()
    finally:
        release.set()
        lasting.join()


# ---------------------------------------------------------------- fixtures

_SETUPS: list[str] = []


def counted(name: str = "wide") -> Any:
    _SETUPS.append(name)
    yield name.upper()
    _SETUPS.append(f"end {name}")


def _plan(scope: str, scope_key: str, param: Any = None) -> FixturePlan:
    ref = FunctionRef(__name__, __file__, "counted", False)
    fixture = RankFixture(
        "key-wide", "wide", scope, scope_key, ref, None, (), param, param is not None
    )
    return FixturePlan((("value", Arg(ARG_FIXTURE, "key-wide")),), (fixture,))


def _load(ref: FunctionRef) -> Any:
    return globals()[ref.qualname]


def _arguments(plan: FixturePlan, scopes: fixtures.Scopes | None = None) -> dict[str, Any]:
    setup = fixtures.Setup(plan, {}, _load, lambda exc: None, scopes or fixtures.Scopes())
    value = setup.arguments()
    setup.teardown()
    return value


def test_a_wider_scoped_fixture_is_cached_by_its_scope_key() -> None:
    _SETUPS.clear()
    scopes = fixtures.Scopes()
    try:
        assert _arguments(_plan("module", "mod-a"), scopes) == {"value": "WIDE"}
        assert _arguments(_plan("module", "mod-a"), scopes) == {"value": "WIDE"}
        assert _SETUPS == ["wide"]  # set up once for its scope
        assert _arguments(_plan("module", "mod-b"), scopes) == {"value": "WIDE"}
        assert _SETUPS == ["wide", "wide"]  # another scope, another instance
        scopes.end(["mod-a"])
        assert _SETUPS == ["wide", "wide", "end wide"]
    finally:
        scopes.end(None)
    assert _SETUPS == ["wide", "wide", "end wide", "end wide"]
    assert scopes.groups() == set()


def test_a_function_scoped_fixture_ends_with_its_call() -> None:
    _SETUPS.clear()
    assert _arguments(_plan("function", "")) == {"value": "WIDE"}
    assert _SETUPS == ["wide", "end wide"]


def test_another_param_ends_the_cached_instance() -> None:
    _SETUPS.clear()
    scopes = fixtures.Scopes()
    try:
        _arguments(_plan("session", "", param=1), scopes)
        _arguments(_plan("session", "", param=1), scopes)
        _arguments(_plan("session", "", param=2), scopes)
        assert _SETUPS == ["wide", "end wide", "wide"]
    finally:
        scopes.end(None)
