"""Fault specs without ranks: each rule of a fault's arguments and of a run's list of faults,
naming the bad value; how faults read; how a sweep lays them out
(``tests/faults/test_fault_specs.py`` holds the common cases)."""

from __future__ import annotations

import math
import pickle
import signal

import pytest

from harness import faults
from harness.faults import Fault, FaultFired, checks

# ---------------------------------------------------------------- one fault's arguments


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        pytest.param(
            Fault("explode", 0, 1),
            "unknown fault kind 'explode'; valid: kill, exit, error, delay, hang, corrupt",
            id="kind",
        ),
        pytest.param(faults.kill(-1, 1), "rank must be an int >= 0, not -1", id="rank"),
        pytest.param(
            faults.kill(0, 0),
            "at must be an int >= 1 (collectives are counted from 1) or a faults.Collective, not 0",
            id="at",
        ),
        pytest.param(
            faults.kill(0, 1, attempt=-1), "attempt must be an int >= 0, not -1", id="attempt"
        ),
        pytest.param(
            faults.hang(0, 1, group=[0, 1]),  # type: ignore[arg-type]
            "group must be a non-empty tuple of global ranks (e.g. (0, 1)) or None for the "
            "default group, not [0, 1]",
            id="group-a-tuple",
        ),
        pytest.param(
            faults.hang(0, 1, group=(0, "1")),  # type: ignore[arg-type]
            "a rank of group must be an int >= 0, not '1'",
            id="group-members",
        ),
        pytest.param(
            faults.hang(0, 1, group=(0, 0)), "group (0, 0) names a rank twice", id="group-twice"
        ),
        pytest.param(
            faults.hang(2, 1, group=(0, 1)),
            "rank 2 is not a member of group (0, 1)",
            id="group-has-the-rank",
        ),
        pytest.param(
            faults.kill(0, 1, when="later"),
            "unknown when 'later'; valid: 'before', 'during', 'after'",
            id="when",
        ),
        pytest.param(
            faults.kill(0, 1, signal=999),
            "signal must be a signal number such as signal.SIGKILL, not 999",
            id="signal",
        ),
        pytest.param(
            faults.exit(0, 1, 256), "code must be an exit status from 0 to 255, not 256", id="code"
        ),
        pytest.param(
            faults.error(0, 1, "boom"),  # type: ignore[arg-type]
            "exc must be an exception or an exception class (e.g. RuntimeError('peer lost')), "
            "not 'boom'",
            id="exc",
        ),
        pytest.param(
            faults.delay(0, 1, -1), "seconds must be a finite number >= 0, not -1", id="seconds"
        ),
        pytest.param(
            faults.corrupt(0, 1, 3),  # type: ignore[arg-type]
            "fn must be callable (it gets the rank's tensor), not 3",
            id="fn",
        ),
        pytest.param(
            faults.hang(0, 1, strict="no"),  # type: ignore[arg-type]
            "strict must be True or False, not 'no'",
            id="strict",
        ),
    ],
)
def test_each_rule_of_a_faults_arguments_names_the_bad_value(fault: Fault, message: str) -> None:
    assert fault.problem() == message
    with pytest.raises(ValueError) as info:
        checks.checked([fault], 4)
    assert str(info.value) == f"fault {fault}: {message}"


def test_the_first_rule_that_finds_something_is_told() -> None:
    # An unknown kind says so, whatever else is wrong; a bad rank before a bad group.
    assert Fault("explode", -1, 0).problem().startswith("unknown fault kind 'explode'")
    assert faults.hang(-1, 1, group=()).problem() == "rank must be an int >= 0, not -1"


def test_an_argument_of_another_kind_is_checked_only_for_its_own() -> None:
    # exc and fn default to None, which only an error or a corruption must not keep.
    assert faults.kill(0, 1).problem() == ""
    assert Fault("delay", 0, 1, code=300).problem().startswith("code must be")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Fault("explode", 0, 1), "unknown fault kind 'explode'; valid: kill, "),
        (lambda: faults.kill(True, 1), "rank must be an int >= 0, not True"),
        (lambda: faults.kill(0, 1.0), "at must be an int >= 1 (collectives are counted from 1)"),
        (lambda: faults.hang(0, 1, group=()), "group must be a non-empty tuple"),
        (lambda: faults.hang(0, 1, group=(0, -1)), "a rank of group must be an int >= 0, not -1"),
        (lambda: faults.exit(0, 1, True), "code must be an exit status from 0 to 255, not True"),
        (lambda: faults.exit(0, 1, -1), "not -1"),
        (lambda: faults.delay(0, 1, math.inf), "seconds must be a finite number >= 0, not inf"),
        (lambda: faults.delay(0, 1, math.nan), "not nan"),
        (lambda: faults.delay(0, 1, "1"), "not '1'"),
        (lambda: faults.error(0, 1, None), "exc must be an exception or an exception class"),
        (lambda: faults.error(0, 1, int), "not <class 'int'>"),
        (lambda: faults.kill(0, 1, signal=999), "not 999"),
        (lambda: Fault("kill", 0, 1, signal="KILL"), "signal must be a signal number"),
    ],
)
def test_a_bad_fault_is_made_and_named_with_the_value_when_checked(make, message: str) -> None:
    fault = make()  # never at a test module's import: its run or test fails instead
    with pytest.raises(ValueError) as info:
        fault.check(8)
    assert str(info.value).startswith(f"fault {fault}: ")
    assert message in str(info.value)


@pytest.mark.parametrize("value", ["KILL", 9.5, 9.0, True, None])
def test_kill_names_a_bad_signal_as_the_spec_does(value: object) -> None:
    fault = faults.kill(0, 1, signal=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as info:
        fault.check(2)
    assert str(info.value) == (
        f"fault {fault}: signal must be a signal number such as signal.SIGKILL, not {value!r}"
    )


def test_a_fault_is_checked_against_the_world_by_each_rank_it_names() -> None:
    faults.hang(1, 1, group=(0, 1)).check(2)
    with pytest.raises(ValueError) as info:
        faults.hang(1, 1, group=(1, 5)).check(3)
    assert str(info.value) == (
        "fault hang(rank=1, at=1, group=(1, 5)): rank 5 is not in a world of 3 "
        "(valid ranks: 0 to 2)"
    )
    with pytest.raises(ValueError, match="not in a world of 1"):
        faults.kill(1, 1).check(1)


def test_a_fault_of_another_kind_keeps_its_unused_fields_default() -> None:
    # when/signal apply to kill alone; a delay does not check them against its kind.
    fault = faults.delay(1, 2, 0)
    assert (fault.when, fault.signal, fault.code, fault.exc, fault.fn) == (
        "before",
        signal.SIGKILL,
        0,
        None,
        None,
    )
    assert faults.error(0, 1, RuntimeError).exc is RuntimeError


# ---------------------------------------------------------------- how a fault reads


def _top_level(tensor: object) -> None:
    return None


def test_a_group_is_kept_sorted_and_named() -> None:
    fault = faults.hang(2, 1, group=(2, 0))
    assert fault.group == (0, 2)
    assert fault.group_name == "group (0, 2)"
    assert faults.hang(2, 1).group_name == "the default group"
    assert fault.id == "hang-r2-at1-g0_2"


@pytest.mark.parametrize(
    ("fault", "enters"),
    [
        (faults.kill(0, 1), False),
        (faults.kill(0, 1, when="during"), True),
        (faults.kill(0, 1, when="after"), True),
        (faults.exit(0, 1, 0), False),
        (faults.hang(0, 1), False),
        (faults.error(0, 1, RuntimeError), True),
        (faults.delay(0, 1, 0.1), True),
        (faults.corrupt(0, 1, _top_level), True),
    ],
)
def test_which_faults_let_the_rank_enter_the_collective(fault: Fault, enters: bool) -> None:
    assert fault.enters is enters


def test_how_faults_read() -> None:
    assert (
        repr(faults.kill(0, 2, signal=signal.SIGTERM))
        == "faults.kill(rank=0, at=2, signal=SIGTERM)"
    )
    assert faults.kill(0, 2, when="after").id == "kill-after-r0-at2"
    assert str(faults.delay(1, 1, 2)) == "delay(rank=1, at=1, seconds=2)"
    # A value of the wrong type reads as what it is.
    assert str(faults.kill(rank="x", at="1")) == "kill(rank='x', at='1')"  # type: ignore[arg-type]
    assert str(faults.hang(0, 1, group="01")) == "hang(rank=0, at=1, group='01')"  # type: ignore[arg-type]
    fired = FaultFired(faults.hang(1, 3), "hung before collective #3", 12.5)
    assert str(fired) == "rank 1 hung before collective #3"
    assert repr(fired) == "FaultFired(rank 1 hung before collective #3)"


# ---------------------------------------------------------------- sweeps


def test_a_sweep_takes_a_kinds_name_or_function_and_keeps_every_pair_in_order() -> None:
    by_name = faults.sweep("exit", ranks=[1, 0], at=(3, 1), code=2)
    by_function = faults.sweep(faults.exit, ranks=[1, 0], at=(3, 1), code=2)
    assert by_name == by_function
    assert [(f.rank, f.at) for f in by_name] == [(1, 3), (1, 1), (0, 3), (0, 1)]
    assert all(f.code == 2 for f in by_name)
    assert isinstance(pickle.loads(pickle.dumps(by_name)), tuple)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: faults.sweep(print, ranks=[0], at=[1]),
            ValueError,
            "unknown fault kind <built-in",
        ),
        (lambda: faults.sweep("delay", ranks=[0], at=[1]), TypeError, "seconds"),
        (lambda: faults.sweep("kill", ranks=[0], at=[]), ValueError, "has no (rank, at) pair"),
    ],
)
def test_a_sweep_without_cases_or_a_kind_fails_when_checked(make, error, message: str) -> None:
    made = make()  # at a test module's import: nothing fails yet
    assert isinstance(made, faults.InvalidSweep)
    with pytest.raises(error) as info:
        checks.checked(made, 2)
    assert message in str(info.value)


# ---------------------------------------------------------------- a run's list of faults


def test_checked_takes_lists_and_tuples_and_returns_a_tuple() -> None:
    assert checks.checked([], 1) == ()
    pair = (faults.kill(0, 1), faults.kill(0, 2))
    assert checks.checked(list(pair), 1) == pair
    assert checks.checked(pair, 1) == pair


@pytest.mark.parametrize(
    "value",
    [None, "kill", [faults.kill(0, 1), "hang"], {faults.kill(0, 1)}],
)
def test_checked_rejects_what_is_not_a_list_of_faults(value: object) -> None:
    with pytest.raises(TypeError) as info:
        checks.checked(value, 2, where="World.run(faults=...)")
    assert str(info.value).startswith("World.run(faults=...) must be a list of faults")
    assert repr(value) in str(info.value)


def test_checked_rejects_a_sweep_naming_how_to_run_it() -> None:
    with pytest.raises(TypeError, match=r"for fault in sweep: world.run\(fn, faults=\[fault\]\)"):
        checks.checked(faults.sweep("hang", ranks=[0], at=[1]), 2)


def test_checked_rejects_a_fault_that_does_not_pickle() -> None:
    def local(tensor: object) -> None:
        return None

    with pytest.raises(TypeError) as info:
        checks.checked([faults.corrupt(0, 1, local)], 2)
    text = str(info.value)
    assert text.startswith("fault corrupt(rank=0, at=1, fn=")
    assert "does not pickle" in text
    assert text.endswith("its function or exception must be defined at module level")


def test_the_same_collective_number_on_other_groups_or_ranks_is_no_clash() -> None:
    placed = [
        faults.kill(0, 1),
        faults.delay(0, 1, 1.0, group=(0, 1)),
        faults.delay(0, 1, 1.0, group=(0, 2)),
        faults.hang(1, 1),
    ]
    assert len(checks.checked(placed, 3)) == 4
    with pytest.raises(ValueError) as info:
        checks.checked([*placed, faults.exit(0, 1, 1, group=(1, 0))], 3)
    assert str(info.value) == (
        "faults: delay(rank=0, at=1, seconds=1, group=(0, 1)) and exit(rank=0, at=1, code=1, "
        "group=(0, 1)) both act at collective #1 of rank 0 on group (0, 1); give one"
    )


def test_the_same_collective_in_another_attempt_is_no_clash() -> None:
    twice = [faults.kill(1, 1), faults.exit(1, 1, 3, attempt=1)]
    assert checks.checked(twice, (2, 2)) == tuple(twice)


def test_a_fault_in_an_attempt_the_run_does_not_have_names_the_restarts() -> None:
    late = faults.kill(1, 1, attempt=2)
    for sizes, restarts in (
        ((2,), "0 restarts (attempts 0 to 0)"),
        ((2, 2), "1 restart (attempts 0 to 1)"),
    ):
        with pytest.raises(ValueError) as info:
            checks.checked([late], sizes)
        assert str(info.value) == (
            f"fault kill(rank=1, at=1, attempt=2) acts in attempt 2, but the run has {restarts}"
        )
    assert checks.checked([late], (2, 2, 2)) == (late,)


def test_a_fault_fits_the_world_of_its_own_attempt() -> None:
    # Against the largest world first (4), then its attempt's (2).
    checks.checked([faults.kill(3, 1)], (4, 2))
    with pytest.raises(ValueError) as info:
        checks.checked([faults.kill(3, 1, attempt=1)], (4, 2))
    assert str(info.value) == (
        "fault kill(rank=3, at=1, attempt=1): rank 3 is not in a world of 2 (valid ranks: 0 to 1)"
    )


def test_one_calls_faults_are_not_checked_for_their_attempt() -> None:
    # World.call's: a restarted run's attempt hands its ranks the faults of that attempt.
    later = faults.kill(1, 1, attempt=3)
    assert checks.checked([later], 2) == (later,)
