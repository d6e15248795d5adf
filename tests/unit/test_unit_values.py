"""User values checked before any process starts: the validators' remaining cases
(``tests/harness/test_harness_validate.py`` holds the common ones; the faults' are in
``test_unit_faults.py``)."""

from __future__ import annotations

import argparse

import pytest

from harness import validate


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
