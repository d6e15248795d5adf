"""How a rank's failure is described (``RankFailure``) and phrased, and the phase durations a
test's report takes from its ranks."""

from __future__ import annotations

import signal

import pytest

from harness.controller.outcome import Outcome
from harness.errors import RankError
from harness.plugin import after_run
from harness.protocol import failures
from harness.protocol.failures import (
    EXIT_CODE_ATTR,
    EXIT_MAIN_REIMPORTED,
    PHASE_ATTR,
    TIMES_ATTR,
    RankFailure,
)

HIDDEN = "/hidden/harness"

# Code "in the harness": a loop that runs the user's function and returns what it raised, and
# a wrapper between the user's code and a library, as the rank's collective recorder is.
_HIDDEN_SOURCE = """
def run(fn):
    try:
        fn()
    except BaseException as exc:
        return exc

def wrapper(fn):
    return fn()
"""
_hidden: dict[str, object] = {}
exec(compile(_HIDDEN_SOURCE, f"{HIDDEN}/loop.py", "exec"), _hidden)


def _raised(fn):
    return _hidden["run"](fn)


def _boom() -> None:
    raise ValueError("boom")


def _through_wrapper() -> None:
    _hidden["wrapper"](_boom)


def _failure(exc: BaseException, **kwargs: object) -> RankFailure:
    return RankFailure.from_exception(exc, 1, hidden_dir=HIDDEN, **kwargs)


# ---------------------------------------------------------------- from an exception


def test_an_exception_is_described_without_the_harness_frames() -> None:
    failure = _failure(_raised(_through_wrapper))
    assert (failure.rank, failure.exc_type, failure.message) == (1, "ValueError", "boom")
    assert failure.traceback.startswith("Traceback (most recent call last):\n")
    assert failure.traceback.endswith("ValueError: boom\n")
    assert HIDDEN not in failure.traceback
    assert "in _through_wrapper" in failure.traceback
    assert "in _boom" in failure.traceback
    assert (failure.phase, failure.exitcode, failure.times) == ("call", None, None)


def test_an_exception_raised_in_harness_code_only_keeps_its_last_line() -> None:
    failure = _failure(_hidden["run"](lambda: _hidden["wrapper"](lambda: 1 / 0)))
    # The lambdas are this file's: only they remain.
    assert HIDDEN not in failure.traceback
    assert failure.traceback.endswith("ZeroDivisionError: division by zero\n")


def test_an_exception_without_a_traceback_reads_as_its_last_line() -> None:
    failure = _failure(KeyError("k"))
    assert failure.traceback == "KeyError: 'k'\n"
    assert failure.message == "'k'"


def test_an_unprintable_exception_is_still_described() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    failure = _failure(Unprintable())
    assert failure.message == (
        "<unprintable test_an_unprintable_exception_is_still_described.<locals>.Unprintable object>"
    )
    assert failure.exc_type.endswith("<locals>.Unprintable")


def test_a_context_prefixes_the_message_and_ends_the_traceback() -> None:
    failure = _failure(_raised(_boom), context="could not unpickle the call sent to rank 1")
    assert failure.message == "could not unpickle the call sent to rank 1: ValueError: boom"
    assert failure.traceback.endswith(
        "ValueError: boom\n\ncould not unpickle the call sent to rank 1\n"
    )


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({PHASE_ATTR: "setup"}, ("setup", None, None)),
        ({PHASE_ATTR: "teardown"}, ("teardown", None, None)),
        ({PHASE_ATTR: "lunch"}, ("call", None, None)),
        ({EXIT_CODE_ATTR: 3}, ("call", 3, None)),
        ({EXIT_CODE_ATTR: "3"}, ("call", None, None)),
        ({TIMES_ATTR: (0.1, 2.0, 0.3)}, ("call", None, (0.1, 2.0, 0.3))),
        ({TIMES_ATTR: [0.1, 2.0, 0.3]}, ("call", None, None)),
    ],
)
def test_what_the_rank_set_on_the_exception_is_kept_when_valid(
    attrs: dict[str, object], expected: tuple[object, ...]
) -> None:
    exc = RuntimeError("x")
    for name, value in attrs.items():
        setattr(exc, name, value)
    failure = _failure(exc)
    assert (failure.phase, failure.exitcode, failure.times) == expected


# ---------------------------------------------------------------- how failures read


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (None, "closed its connection without exiting"),
        (0, "exited with code 0"),
        (3, "exited with code 3"),
        (-signal.SIGKILL, "was killed by SIGKILL (exit code -9)"),
        (-signal.SIGSEGV, "was killed by SIGSEGV (exit code -11)"),
        (-200, "was killed by signal 200 (exit code -200)"),
        (
            EXIT_MAIN_REIMPORTED,
            "exited with code 86: it re-imported the main module, which starts a world at "
            "import time",
        ),
    ],
)
def test_how_a_process_ended(code: int | None, said: str) -> None:
    assert failures.describe_exitcode(code) == said
    crash = RankFailure.crash(2, code, "")
    assert (crash.exc_type, crash.message) == ("RankCrash", f"the process {said}")
    assert crash.what_happened() == said
    assert crash.render() == f"RankCrash: the process {said}"


def test_what_happened_is_the_first_line_of_the_message() -> None:
    assert RankFailure(
        0, "AssertionError", "assert 1 == 2\n+  where 1 = f()", ""
    ).what_happened() == ("raised AssertionError: assert 1 == 2")
    assert RankFailure(0, "ValueError", "", "").what_happened() == "raised ValueError"
    assert RankFailure(0, "ValueError", "  \n", "").what_happened() == "raised ValueError"


def test_a_failure_renders_its_traceback_without_the_trailing_newlines() -> None:
    assert RankFailure(0, "E", "m", "Traceback...\nE: m\n\n").render() == "Traceback...\nE: m"
    assert RankFailure(0, "E", "m", "").render() == "E: m"


def test_still_running_and_skipped_ranks() -> None:
    late = RankFailure.still_running(3, "did not finish within 5 s", "stacks")
    assert (late.exc_type, late.message, late.traceback) == (
        "WorldTimeout",
        "did not finish within 5 s",
        "stacks",
    )
    skipped = RankFailure.skipped(1, "no gpu", ("/t/test_x.py", 12))
    assert skipped.traceback == "/t/test_x.py:12: Skipped: no gpu\n"
    assert RankFailure.skipped(1, "no gpu").traceback == "Skipped: no gpu\n"


def test_skip_lines_name_the_file_not_its_path() -> None:
    assert failures.skip_line(1, "no gpu", ("/deep/test_x.py", 12)) == (
        "rank 1 (test_x.py:12): no gpu"
    )
    assert failures.skip_line(0, "no gpu", None) == "rank 0: no gpu"


def test_sections_mark_the_root_cause_only_among_several_failures_in_time() -> None:
    first, second = RankFailure(2, "E", "a", "tb2"), RankFailure(0, "E", "b", "tb0")
    both = {2: first, 0: second}
    assert failures.sections(both, root_cause_first=True) == [
        ("rank 2 (root cause)", "tb2"),
        ("rank 0", "tb0"),
    ]
    assert failures.sections(both, root_cause_first=False) == [("rank 2", "tb2"), ("rank 0", "tb0")]
    assert failures.sections({2: first}, root_cause_first=True) == [("rank 2", "tb2")]
    assert failures.sections({}, root_cause_first=True) == []


@pytest.mark.parametrize(
    ("ranks", "said"),
    [
        ([2], "rank 2"),
        ([1, 0], "ranks 0, 1"),
        ([0, 1, 2], "ranks 0-2"),
        ([6, 0, 1, 2, 3], "ranks 0-3, 6"),
        ([0, 1, 3, 4, 5, 7], "ranks 0, 1, 3-5, 7"),
        ([4, 4], "rank 4"),
        ([0, 2, 4], "ranks 0, 2, 4"),
        (list(range(0, 1024, 8)), "ranks 0-1016 step 8"),
        ([1, 3, *range(5, 40, 8)], "ranks 1, 3, 5-37 step 8"),
        ([0, 1, 2, 10, 20, 30, 40], "ranks 0-2, 10-40 step 10"),
    ],
)
def test_ranks_phrase(ranks: list[int], said: str) -> None:
    assert failures.ranks_phrase(ranks) == said


# ---------------------------------------------------------------- phase durations


def _timed(rank: int, times: tuple[float, float, float] | None) -> RankFailure:
    return RankFailure(rank, "E", "m", "", times=times)


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (Outcome(values=[(0.1, 1.0, 0.1), (0.5, 0.5, 0.5), (0.2, 0.2, 0.2)]), (0.5, 0.5, 0.5)),
        # Not each phase's longest: one rank's, the slowest.
        (Outcome(values=[(3.0, 0.0, 0.0), (0.0, 2.0, 2.0)]), (0.0, 2.0, 2.0)),
        # Ranks that said nothing (a plain function's return value) are passed over.
        (Outcome(values=[None, (0.1, 0.2, 0.3), "x"]), (0.1, 0.2, 0.3)),
        (Outcome(values=[None, None]), None),
        (Outcome(), None),
    ],
)
def test_the_slowest_ranks_phase_times_are_the_tests(
    outcome: Outcome, expected: tuple[float, float, float] | None
) -> None:
    assert after_run._rank_times(outcome) == expected


def test_the_phase_times_of_failing_ranks_count_too() -> None:
    error = RankError("boom", {1: _timed(1, (0.0, 5.0, 0.0)), 0: _timed(0, None)})
    assert after_run._rank_times(Outcome(error=error)) == (0.0, 5.0, 0.0)
    returned = Outcome(values=[(0.0, 6.0, 0.0)], error=error)
    assert after_run._rank_times(returned) == (0.0, 6.0, 0.0)
    assert after_run._rank_times(Outcome(error=RankError("x", {0: _timed(0, None)}))) is None
