"""User values checked before any process starts: the validators' remaining cases, and the
fault specs' placement, bad input and how they read (``tests/harness/test_harness_validate.py``
and ``tests/faults/test_fault_specs.py`` hold the common cases)."""

from __future__ import annotations

import argparse
import math
import pickle
import signal

import pytest

from harness import faults, validate
from harness.faults import Fault, FaultFired, checks

# ---------------------------------------------------------------- validators


@pytest.mark.parametrize("value", [True, False])
def test_flag_returns_a_real_bool(value: bool) -> None:
    assert validate.flag(value, "init") is value


@pytest.mark.parametrize("value", [1, 0, "no", "True", None])
def test_flag_rejects_whatever_is_not_a_bool(value: object) -> None:
    with pytest.raises(TypeError) as info:
        validate.flag(value, "init")
    assert str(info.value) == f"init must be True or False, not {value!r}"


@pytest.mark.parametrize(("value", "found"), [("warn", "warn"), ("ERROR", "error"), ("Off", "off")])
def test_one_of_takes_any_case_and_returns_lower_case(value: str, found: str) -> None:
    assert validate.one_of(value, "leaks", validate.LEAK_CHOICES) == found


@pytest.mark.parametrize("value", ["loud", "", " warn", None, 1])
def test_one_of_lists_the_choices(value: object) -> None:
    with pytest.raises(ValueError) as info:
        validate.one_of(value, "leaks", validate.LEAK_CHOICES)
    assert str(info.value) == f"unknown leaks {value!r}; valid: 'warn', 'error', 'off'"


def test_backend_names_where_the_value_came_from() -> None:
    with pytest.raises(ValueError, match=r"^unknown --backend 'GLU'; valid: 'auto', "):
        validate.backend("GLU", "--backend")
    assert set(validate.BACKEND_CHOICES) >= {"auto", "gloo", "nccl"}


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "0", "-1", "", "1e400"])
def test_seconds_rejects_text_that_is_no_positive_finite_number(text: str) -> None:
    with pytest.raises(ValueError) as info:
        validate.seconds(text, "--timeout", text=True)
    assert str(info.value) == f"--timeout must be a positive number of seconds, got {text!r}"


def test_seconds_parses_text_forms_python_reads() -> None:
    assert validate.seconds(" 2.5 ", "t", text=True) == 2.5
    assert validate.seconds("1e-3", "t", text=True) == 0.001
    assert validate.seconds(1e-9, "t") == 1e-9
    assert isinstance(validate.seconds(7, "t"), float)


@pytest.mark.parametrize("text", ["3.0", "two", "", "0x2"])
def test_positive_int_rejects_text_that_is_no_integer(text: str) -> None:
    with pytest.raises(ValueError) as info:
        validate.positive_int(text, "--repeat", text=True)
    assert str(info.value) == f"--repeat must be an int >= 1, not {text!r}"


def test_positive_int_parses_spaced_and_signed_text() -> None:
    assert validate.positive_int(" 3 ", "--repeat", text=True) == 3
    assert validate.positive_int("+2", "--repeat", text=True) == 2
    with pytest.raises(ValueError, match=r"^--repeat must be >= 1, got -2$"):
        validate.positive_int("-2", "--repeat", text=True)


def test_an_argparse_type_is_named_for_usage_messages_and_takes_seconds_too() -> None:
    parse = validate.argparse_type(validate.seconds, "--timeout")
    assert parse.__name__ == "--timeout"
    assert parse("1.5") == 1.5
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse("never")
    assert str(info.value) == "--timeout must be a positive number of seconds, got 'never'"
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--timeout", type=parse)
    assert parser.parse_args(["--timeout", "3"]).timeout == 3.0


# ---------------------------------------------------------------- fault specs


def _top_level(tensor: object) -> None:
    return None


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
def test_a_sweep_without_cases_or_a_kind_fails_when_made(make, error, message: str) -> None:
    with pytest.raises(error) as info:
        make()
    assert message in str(info.value)


@pytest.mark.parametrize("value", ["KILL", 9.5, 9.0, True, None])
def test_kill_names_a_bad_signal_as_the_spec_does(value: object) -> None:
    fault = faults.kill(0, 1, signal=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as info:
        fault.check(2)
    assert str(info.value) == (
        f"fault {fault}: signal must be a signal number such as signal.SIGKILL, not {value!r}"
    )


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
    fired = FaultFired(faults.hang(1, 3), "hung before collective #3", 12.5)
    assert str(fired) == "rank 1 hung before collective #3"
    assert repr(fired) == "FaultFired(rank 1 hung before collective #3)"


def test_a_sweep_takes_a_kinds_name_or_function_and_keeps_every_pair_in_order() -> None:
    by_name = faults.sweep("exit", ranks=[1, 0], at=(3, 1), code=2)
    by_function = faults.sweep(faults.exit, ranks=[1, 0], at=(3, 1), code=2)
    assert by_name == by_function
    assert [(f.rank, f.at) for f in by_name] == [(1, 3), (1, 1), (0, 3), (0, 1)]
    assert all(f.code == 2 for f in by_name)
    assert isinstance(pickle.loads(pickle.dumps(by_name)), tuple)


def test_checked_takes_lists_and_tuples_and_returns_a_tuple() -> None:
    assert checks.checked([], 1) == ()
    pair = (faults.kill(0, 1), faults.kill(0, 2))
    assert checks.checked(list(pair), 1) == pair
    assert checks.checked(pair, 1) == pair


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
