"""Sweeps over "all" ranks and collectives, and their summary, without ranks: how an open
sweep resolves, how cases read and group into ranges, and what bad input says."""

from __future__ import annotations

import pytest

from harness import faults
from harness.faults import checks
from harness.plugin import sweep_cases, sweep_count
from harness.plugin.sweep_summary import (
    MAX_CASES,
    Case,
    fault_label,
    range_lines,
    ranges,
    summary,
    too_many,
    verdict,
)

PASSED = "passed"
BROKEN = "failed (verify check: AssertionError: shard-1 missing)"


def _case(rank: int, at: int, outcome: str = PASSED, fault: str = "kill", site: str = "") -> Case:
    return Case("test_x.py::test_save", fault, rank, at, site, outcome, f"pytest x-r{rank}-{at}")


def module_level_check(tmp_path: object) -> None:
    """A verify= function as the marker wants it."""


# ------------------------------------------------------------------------- open sweeps


def test_a_sweep_over_all_is_open_until_the_marker_resolves_it() -> None:
    swept = faults.sweep("kill", ranks="all", at="all", when="after")
    assert isinstance(swept, faults.OpenSweep)
    counts = {0: 2, 1: 3}
    resolved = swept.faults(2, counts.__getitem__)
    assert isinstance(resolved, faults.Sweep)
    assert [f.id for f in resolved] == [
        "kill-after-r0-at1",
        "kill-after-r0-at2",
        "kill-after-r1-at1",
        "kill-after-r1-at2",
        "kill-after-r1-at3",
    ]
    assert str(swept) == "sweep('kill', ranks='all', at='all', when='after')"


def test_all_ranks_with_explicit_collectives_needs_no_count() -> None:
    swept = faults.sweep(faults.exit, ranks="all", at=[2], code=3)
    assert isinstance(swept, faults.OpenSweep)
    assert [f.id for f in swept.faults(3)] == ["exit-r0-at2", "exit-r1-at2", "exit-r2-at2"]


def test_all_ranks_of_a_group_are_its_members() -> None:
    swept = faults.sweep("hang", ranks="all", at=[1], group=(2, 0))
    assert isinstance(swept, faults.OpenSweep)
    assert swept.group == (0, 2)
    assert [f.rank for f in swept.faults(4)] == [0, 2]


def test_explicit_ranks_and_collectives_are_a_plain_sweep_as_before() -> None:
    swept = faults.sweep("kill", ranks=[1], at=range(1, 3))
    assert isinstance(swept, faults.Sweep)
    assert [f.id for f in swept] == ["kill-r1-at1", "kill-r1-at2"]


def test_an_open_sweeps_bad_argument_value_is_named_by_its_faults_when_resolved() -> None:
    swept = faults.sweep("kill", ranks="all", at="all", when="later")  # made, as any fault
    assert isinstance(swept, faults.OpenSweep)
    (first, _) = swept.faults(2, lambda rank: 1)
    with pytest.raises(ValueError) as info:
        first.check(2)
    assert str(info.value) == (
        "fault kill(rank=0, at=1, when='later'): unknown when 'later'; valid: 'before', "
        "'during', 'after'"
    )


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: faults.sweep("kill", ranks="every", at="all"), ValueError, "ranks must be 'all'"),
        (lambda: faults.sweep("kill", ranks="all", at="each"), ValueError, "at must be 'all'"),
        (lambda: faults.sweep("delay", ranks="all", at="all"), TypeError, "seconds"),
        (lambda: faults.sweep("boom", ranks="all", at="all"), ValueError, "unknown fault kind"),
    ],
)
def test_bad_open_sweeps_fail_the_run_given_them(
    make: object, error: type[Exception], message: str
) -> None:
    made = make()  # type: ignore[operator]  # at a test module's import: nothing fails yet
    with pytest.raises(error, match=message):
        checks.checked(made, 2)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: faults.sweep("kill", ranks="all", at="all").faults(2),  # type: ignore[union-attr]
            ValueError,
            "at='all' needs a clean run's collective counts",
        ),
        (
            lambda: checks.checked(faults.sweep("kill", ranks="all", at="all"), 2),
            TypeError,
            "a sweep of faults is meant one",
        ),
    ],
)
def test_bad_open_sweeps_are_named(make: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        make()  # type: ignore[operator]


# --------------------------------------------------------------------------- verify=


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (lambda tmp_path: None, "verify must be a module-level function"),
        ("module:check", "verify must be a module-level function .*'module:check'"),
        (print, "verify must be a module-level function"),
    ],
)
def test_verify_must_be_a_module_level_function(value: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        sweep_cases.check_verify(value)


def test_a_nested_verify_function_is_named() -> None:
    def nested(tmp_path: object) -> None: ...

    with pytest.raises(TypeError, match="not <function test_a_nested_verify_function"):
        sweep_cases.check_verify(nested)


def test_verify_may_be_none_or_a_module_level_function() -> None:
    assert sweep_cases.check_verify(None) is None
    assert sweep_cases.check_verify(module_level_check) is module_level_check


# ------------------------------------------------------------------- the counting run


def test_two_clean_runs_that_differ_say_where() -> None:
    one = {"0": {"": [["all_reduce", "x.py:3"]]}, "1": {"": [["all_reduce", "x.py:3"]]}}
    other = {"0": {"": [["all_reduce", "x.py:3"]]}, "1": {"": [], "0,1": [["barrier", "x.py:4"]]}}
    assert sweep_count._difference(one, one) == ""
    assert sweep_count._difference(one, other) == (
        "rank 1 made 1 collective on the default group, then 0"
    )
    assert sweep_count._difference({"1": {}}, {"1": {"0,1": [["b", "x"]]}}) == (
        "rank 1 made 0 collectives on group (0,1), then 1"
    )


def test_the_counting_run_gets_the_arguments_it_needs() -> None:
    given = ["-p", "no:cov", "-x", "-o", "dist_leaks=off", "--dist-backend", "gloo"]
    given += ["--dist-timeout=30", "-pxdist", "tests/", "-k", "save"]
    assert sweep_count._passed_on(given) == [
        "-p",
        "no:cov",
        "-o",
        "dist_leaks=off",
        "--dist-backend=gloo",
        "--dist-timeout=30",
        "-pxdist",
    ]


# ------------------------------------------------------------------------ the summary


def test_ranges_are_consecutive_runs() -> None:
    assert ranges([5, 1, 2, 3, 7, 8, 3]) == [(1, 3), (5, 5), (7, 8)]
    assert ranges([]) == []


def test_cases_that_agree_on_every_rank_are_one_line() -> None:
    cases = [_case(rank, at) for rank in range(3) for at in range(1, 15)]
    assert range_lines(cases) == ["kill at #1-#14 on any rank: passed"]


def test_a_failing_range_on_one_rank_splits_the_others() -> None:
    cases = [
        _case(rank, at, BROKEN if rank == 1 and 3 <= at <= 5 else PASSED)
        for rank in range(2)
        for at in range(1, 8)
    ]
    assert range_lines(cases) == [
        "kill at #1-#2 on any rank: passed",
        "kill at #3-#5 on rank 0: passed",
        f"kill at #3-#5 on rank 1: {BROKEN}",
        "kill at #6-#7 on any rank: passed",
    ]


def test_ranks_with_more_collectives_than_others_read_as_theirs() -> None:
    cases = [_case(0, 1), _case(0, 2), _case(1, 1), _case(1, 2), _case(1, 3), _case(2, 1)]
    assert range_lines(cases) == [
        "kill at #1 on any rank: passed",
        "kill at #2 on ranks 0, 1: passed",
        "kill at #3 on rank 1: passed",
    ]


def test_three_ranks_in_a_row_read_as_a_range() -> None:
    cases = [_case(rank, 1, BROKEN if rank < 3 else PASSED) for rank in range(5)]
    assert range_lines(cases) == [
        f"kill at #1 on ranks 0-2: {BROKEN}",
        "kill at #1 on ranks 3, 4: passed",
    ]


def test_a_kill_after_or_during_reads_so() -> None:
    assert fault_label("kill", "after") == "kill after"
    assert fault_label("kill") == "kill"
    assert fault_label("exit", "after") == "exit"
    cases = [_case(0, at, fault="kill after") for at in (1, 2)]
    assert range_lines(cases) == ["kill after #1-#2 on rank 0: passed"]


def test_the_summary_names_each_failing_kill_point_and_its_command() -> None:
    cases = [
        _case(1, 2, BROKEN, site="all_reduce at x.py:9"),
        _case(0, 1),
        _case(0, 2),
        _case(1, 1),
        Case("test_x.py::test_other", "exit", 0, 1, "", "skipped", "pytest other"),
    ]
    assert summary(cases) == [
        "test_x.py::test_other: exit, 1 case, 0 failed",
        "  exit at #1 on rank 0: skipped",
        "test_x.py::test_save: kill, 4 cases, 1 failed",
        "  kill at #1 on any rank: passed",
        "  kill at #2 on rank 0: passed",
        f"  kill at #2 on rank 1: {BROKEN}",
        "  failed at rank 1, #2 (all_reduce at x.py:9): pytest x-r1-2",
    ]


def test_a_case_travels_as_json() -> None:
    case = _case(1, 3, BROKEN, site="barrier at y.py:2")
    assert Case.loads(case.dumps()) == case
    assert case.point == "rank 1, #3 (barrier at y.py:2)"
    assert _case(0, 4).point == "rank 0, #4"


def test_a_verdict_shows_the_first_line_of_a_failure_cut_short() -> None:
    assert verdict(False, False, "") == "passed"
    assert verdict(False, True, "") == "skipped"
    assert verdict(True, False, "RankError: boom\nmore") == "failed (RankError: boom)"
    long = verdict(True, False, "x" * 300)
    assert long.endswith("...)")
    assert len(long) < 140


def test_too_many_cases_says_how_many_and_how_to_sweep_fewer() -> None:
    message = too_many("test_x.py::test_long", 502, {1: 251, 0: 251})
    assert message == (
        "test_x.py::test_long: a sweep over every collective would make 502 cases "
        "(collectives of a clean run: rank 0: 251, rank 1: 251), more than 500: sweep some "
        "of them, e.g. at=range(1, 50), or fewer ranks (ranks=[1])"
    )
    assert MAX_CASES == 500
