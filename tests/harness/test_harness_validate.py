"""The one validator of user values: every message names where the value came from, the value
and what would be valid."""

from __future__ import annotations

import argparse
import math

import pytest

from harness import validate


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0, ValueError, "world_size must be >= 1, got 0"),
        (-3, ValueError, "world_size must be >= 1, got -3"),
        ("2", TypeError, "world_size must be an int >= 1, not '2'"),
        (2.0, TypeError, "world_size must be an int >= 1, not 2.0"),
        (True, TypeError, "world_size must be an int >= 1, not True"),
        (None, TypeError, "world_size must be an int >= 1, not None"),
    ],
)
def test_positive_int_rejects(value: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        validate.positive_int(value, "world_size")
    assert str(info.value) == message


def test_positive_int_parses_text_only_when_asked() -> None:
    assert validate.positive_int(4, "world_size") == 4
    assert validate.positive_int("4", "--world-size", text=True) == 4
    with pytest.raises(ValueError, match=r"^--world-size must be an int >= 1, not 'four'$"):
        validate.positive_int("four", "--world-size", text=True)
    with pytest.raises(ValueError, match=r"^--world-size must be >= 1, got 0$"):
        validate.positive_int("0", "--world-size", text=True)


@pytest.mark.parametrize("value", [0, -1.5, math.nan, math.inf, "5", True, None])
def test_seconds_rejects(value: object) -> None:
    with pytest.raises(ValueError) as info:
        validate.seconds(value, "timeout", optional=True)
    assert str(info.value) == (
        f"timeout must be a positive number of seconds or None, got {value!r}"
    )


def test_seconds_accepts_numbers_and_text_when_asked() -> None:
    assert validate.seconds(3, "timeout") == 3.0
    assert validate.seconds(0.25, "timeout") == 0.25
    assert validate.seconds("60", "ini option dist_timeout", text=True) == 60.0
    with pytest.raises(ValueError) as info:
        validate.seconds("soon", "ini option dist_timeout", text=True)
    assert str(info.value) == (
        "ini option dist_timeout must be a positive number of seconds, got 'soon'"
    )


def test_backend_names_the_valid_choices() -> None:
    assert validate.backend("GLOO") == "gloo"
    assert validate.backend("auto") == "auto"
    with pytest.raises(ValueError) as info:
        validate.backend("nope")
    assert str(info.value) == (
        "unknown backend 'nope'; valid: 'auto', 'gloo', 'nccl', 'ucc', 'mpi', 'xccl'"
    )


def test_argparse_type_keeps_the_validators_message() -> None:
    parse = validate.argparse_type(validate.positive_int, "world size")
    assert parse("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match=r"^world size must be >= 1, got 0$"):
        parse("0")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            10.0,
            "args must be a tuple (or list) of positional arguments for fn, not 10.0 (float); "
            "for a single argument write args=(10.0,)",
        ),
        (
            "ab",
            "args must be a tuple (or list) of positional arguments for fn, not 'ab' (str); "
            "for a single argument write args=('ab',)",
        ),
        (
            b"ab",
            "args must be a tuple (or list) of positional arguments for fn, not b'ab' (bytes); "
            "for a single argument write args=(b'ab',)",
        ),
        (
            {"x": 1},
            "args must be a tuple (or list) of positional arguments for fn, not {'x': 1} "
            "(dict); keyword arguments go in kwargs={'x': 1}",
        ),
        (
            None,
            "args must be a tuple (or list) of positional arguments for fn, not None "
            "(NoneType); for a single argument write args=(None,)",
        ),
    ],
)
def test_call_args_rejects_what_is_no_sequence_of_arguments(value: object, message: str) -> None:
    with pytest.raises(TypeError) as info:
        validate.call_args(value)
    assert str(info.value) == message


def test_call_args_takes_any_other_iterable() -> None:
    assert validate.call_args((1, "a")) == (1, "a")
    assert validate.call_args([1, 2]) == (1, 2)
    assert validate.call_args(x for x in range(3)) == (0, 1, 2)
    assert validate.call_args(()) == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            [("x", 1)],
            "kwargs must be a mapping (a dict) of keyword arguments for fn, not [('x', 1)] (list)",
        ),
        (3, "kwargs must be a mapping (a dict) of keyword arguments for fn, not 3 (int)"),
        (
            {1: "x"},
            "kwargs must map the names (str) of fn's keyword arguments to their values; it "
            "has the key 1 (int)",
        ),
    ],
)
def test_call_kwargs_rejects_what_is_no_mapping_of_names(value: object, message: str) -> None:
    with pytest.raises(TypeError) as info:
        validate.call_kwargs(value)
    assert str(info.value) == message


def test_call_kwargs_copies_a_mapping() -> None:
    given = {"x": 1}
    assert validate.call_kwargs(given) == given
    assert validate.call_kwargs(given) is not given
    assert validate.call_kwargs(None) == {}


def test_a_value_is_shown_short_and_never_raises() -> None:
    class Unprintable:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert validate.short_repr("x" * 100) == repr("x" * 100)[:77] + "..."
    assert validate.short_repr(Unprintable()) == (
        "<test_a_value_is_shown_short_and_never_raises.<locals>.Unprintable object>"
    )
