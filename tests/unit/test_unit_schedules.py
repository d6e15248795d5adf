"""Schedules as plain data: a seed's holds, the bound they give, how a hold reads, the
values a user hands over checked, and ``tmp_path`` put back between runs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import find, settings

import harness
from harness import strategies, validate
from harness.plugin import schedules
from harness.protocol.schedules import (
    AFTER,
    BEFORE,
    BOUND,
    DEPTH,
    PEERS,
    WAIT,
    Held,
    Schedule,
    draw,
    escape_probability,
)


def test_a_seed_names_the_same_holds_every_time() -> None:
    counts = {0: 6, 1: 6}
    assert draw(7, counts) == draw(7, counts)
    drawn = {draw(seed, counts).holds for seed in range(1, 51)}
    assert len(drawn) > 20  # seeds differ
    # Written out here: a change of the generator changes every seed's schedule.
    assert draw(1, counts).holds == draw(1, dict(counts)).holds


def test_a_schedule_holds_depth_ranks_at_distinct_boundaries_they_cross() -> None:
    counts = {0: 4, 1: 3, 2: 5}
    for seed in range(200):
        schedule = draw(seed, counts, 0.5)
        assert len(schedule.holds) == DEPTH
        assert (schedule.seed, schedule.delay) == (seed, 0.5)
        assert len({at for _, at in schedule.holds}) == DEPTH
        assert all(1 <= at <= counts[rank] for rank, at in schedule.holds)
        assert list(schedule.holds) == sorted(schedule.holds, key=lambda h: (h[1], h[0]))


def test_every_boundary_of_every_rank_is_held_alike() -> None:
    counts = {0: 3, 1: 3}
    firsts: dict[tuple[int, int], int] = {}
    for seed in range(6000):
        numbers = draw(seed, counts).holds
        # The first hold drawn is the one at the lower boundary or the other: count both.
        for hold in numbers:
            firsts[hold] = firsts.get(hold, 0) + 1
    assert sorted(firsts) == [(rank, at) for rank in (0, 1) for at in (1, 2, 3)]
    # Each of the 6 pairs is among a schedule's 2 holds a third of the time, give or take.
    assert all(1600 < count < 2400 for count in firsts.values()), firsts


def test_fewer_boundaries_than_holds_hold_what_there_is() -> None:
    assert draw(3, {0: 1, 1: 1}).holds in (((0, 1),), ((1, 1),))
    assert draw(3, {0: 0, 1: 0}).holds == ()
    assert draw(3, {}).holds == ()


def test_the_bound_a_number_of_schedules_gives() -> None:
    assert escape_probability(10, 0) == 1.0
    assert escape_probability(10, 1) == pytest.approx(0.9)
    assert escape_probability(10, 50) == pytest.approx(0.9**50)
    assert escape_probability(0, 50) == 1.0


def test_a_schedule_reads_as_it_is_made() -> None:
    schedule = Schedule(((0, 3), (1, 5)), 0.5, 7)
    assert repr(schedule) == "Schedule(holds=((0, 3), (1, 5)), delay=0.5, seed=7)"
    assert repr(Schedule(((1, 2),))) == "Schedule(holds=((1, 2),))"
    assert schedule.without((0, 3)) == Schedule(((1, 5),), 0.5, 7)
    assert schedule.longest == 1.0
    assert Schedule(((0, 1),)).longest == 1.0  # the default delay
    assert harness.Schedule is Schedule


@pytest.mark.parametrize(
    ("held", "text"),
    [
        (
            Held(0, 4, AFTER, "collective #2 (all_reduce)", "t.py:14", 0.0123, PEERS),
            "rank 0 held at boundary 4, after collective #2 (all_reduce) at t.py:14 returned: "
            "0.012 s, until its peers were blocked",
        ),
        (
            Held(
                1,
                1,
                BEFORE,
                "collective #1 (barrier) on the group of ranks 0, 1",
                "t.py:3",
                1,
                BOUND,
            ),
            "rank 1 held at boundary 1, before collective #1 (barrier) on the group of ranks "
            "0, 1 at t.py:3: 1.000 s, the longest a hold lasts (its peers were still busy)",
        ),
        (
            Held(1, 3, WAIT, "collective #1 (all_reduce)", "t.py:9", 0.5),
            "rank 1 held at boundary 3, before waiting on collective #1 (all_reduce) at t.py:9: "
            "0.500 s, and was still held when the call ended",
        ),
    ],
)
def test_what_a_hold_did_reads_in_one_line(held: Held, text: str) -> None:
    assert str(held) == text


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("((0, 1),)", TypeError, "must be a harness.Schedule"),
        (Schedule([(0, 1)]), TypeError, "must hold (rank, boundary) pairs of ints"),  # type: ignore[arg-type]
        (Schedule(((0, 1.0),)), TypeError, "holds=((0, 1.0),)"),  # type: ignore[arg-type]
        (Schedule(((0, 1, 2),)), TypeError, "pairs"),  # type: ignore[arg-type]
        (Schedule(((-1, 1),)), ValueError, "has the hold (-1, 1): a rank is >= 0"),
        (Schedule(((0, 0),)), ValueError, "has the hold (0, 0)"),
        (Schedule((), delay=0), ValueError, "drawn argument 'schedule''s delay must be a pos"),
    ],
)
def test_a_bad_schedule_is_named(value: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        validate.schedule(value, "drawn argument 'schedule'")
    assert message in str(info.value)


def test_the_summary_says_what_the_schedules_bound() -> None:
    line = schedules.passed_line("t.py::test_a", (1, 2, 3), 2, 8)
    assert line == (
        "t.py::test_a: 3 schedules passed (2 ranks, 8 boundaries): a race that holding one "
        "rank at one boundary shows escaped them all with probability <= 0.67"
    )
    assert schedules.passed_line("t.py::test_a", (9,), 2, 8) == (
        "t.py::test_a: the schedule of seed 9 passed"
    )
    # One boundary, held by every schedule: nothing escapes.
    assert schedules.passed_line("t.py::test_a", (1, 2), 2, 1) == (
        "t.py::test_a: 2 schedules passed (2 ranks, 1 boundary): a race that holding one "
        "rank at one boundary shows escaped them all with probability <= 0"
    )


def test_tmp_path_is_put_back_as_the_fixtures_left_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    restore = schedules.fresh_tmp_path(SimpleNamespace(funcargs={"tmp_path": tmp_path}))  # type: ignore[arg-type]
    (tmp_path / "model.pt").write_text("saved")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "0").write_text("0")
    (tmp_path / "config.json").write_text("changed")
    restore()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    # Without a tmp_path, there is nothing to put back.
    schedules.fresh_tmp_path(SimpleNamespace(funcargs={}))()  # type: ignore[arg-type]


def test_a_drawn_schedule_shrinks_to_no_hold() -> None:
    strategy = strategies.schedules(ranks=range(2), at=range(1, 9))
    search = settings(database=None, derandomize=True)
    assert find(strategy, lambda s: True, settings=search) == Schedule()
    found = find(strategy, lambda s: len(s.holds) == 2, settings=search)
    assert found == Schedule(((0, 1), (0, 2)))
    assert find(strategy, lambda s: any(r == 1 for r, _ in s.holds), settings=search) == (
        Schedule(((1, 1),))
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"ranks": []}, ValueError, "ranks is empty"),
        ({"ranks": 0, "at": "all"}, TypeError, "at must be an int, a range or list"),
        ({"ranks": 0, "max_holds": 0}, ValueError, "max_holds must be >= 1, got 0"),
    ],
)
def test_bad_arguments_of_the_schedules_strategy_are_named(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        strategies.schedules(**kwargs)
    assert message in str(info.value)
