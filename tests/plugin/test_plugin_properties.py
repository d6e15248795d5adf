"""Property-based distributed tests: ``@given`` on a marked test runs each Hypothesis example
on real ranks, a failure shrinks to the smallest world and arguments, worlds of drawn sizes
are kept warm across examples and closed after the test, and a world_size strategy that can
draw outside the allowed sizes fails before any example runs."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")

HEADER = """
import os
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st

RECORDS = {records!r}

def record(name):
    # One line per example and rank: the world's size, the rank, its pid.
    with open(os.path.join(RECORDS, name), "a") as f:
        f.write(f"{{dist.get_world_size()}} {{dist.get_rank()}} {{os.getpid()}}\\n")

def lines(name):
    path = os.path.join(RECORDS, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [tuple(map(int, line.split())) for line in f]

def alive(pid):
    try:
        with open(f"/proc/{{pid}}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False

QUICK = settings(database=None, derandomize=True, max_examples={examples})
"""


def _file(pytester: pytest.Pytester, records: str, body: str, examples: int = 50) -> None:
    pytester.makepyfile(test_props=HEADER.format(records=records, examples=examples) + body)


def test_a_failure_from_three_ranks_up_shrinks_to_three_ranks(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    records = str(tmp_path_factory.mktemp("records"))
    _file(
        pytester,
        records,
        """
@QUICK
@given(world_size=st.integers(1, 4), n=st.integers(0, 1000))
@pytest.mark.distributed
def test_sum(rank, world_size, n):
    total = torch.tensor([float(n)])
    dist.all_reduce(total)
    if rank == world_size - 1:
        # The planted bug: a rank count capped at 2, wrong from 3 ranks and n >= 2 up.
        assert total.item() == n * min(world_size, 2) or n < 2
""",
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "RankError: rank 2 raised AssertionError: assert (6.0 == *",
            "*- rank 2 -*",
            '  File "*test_props.py", line *, in test_sum',
            "*- collectives -*",
            "rank 0: (1 on the default group)",
            "  #1 all_reduce(SUM, float32?1?) at test_props.py:*",
            "minimal example (3 ranks, * examples run): test_sum(world_size=3, n=2)",
            "to replay it first, add above @given: @example(world_size=3, n=2)",
            "confirmed on fresh processes; run (3 ranks, gloo): pytest test_props.py::test_sum"
            " --dist-backend=gloo",
        ]
    )
    assert "DeadlineExceeded" not in out


def test_a_passing_property_runs_every_example_on_kept_warm_worlds(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    records = str(tmp_path_factory.mktemp("records"))
    _file(
        pytester,
        records,
        """
@QUICK
@given(world_size=st.integers(1, 3), n=st.integers(0, 10**6))
@pytest.mark.distributed
def test_prop(rank, world_size, n):
    record("prop")
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    assert total.item() == world_size

def test_after():
    seen = lines("prop")
    examples = [line for line in seen if line[1] == 0]
    assert len(examples) == 7, seen  # max_examples, each on every rank of its world
    assert {size for size, _, _ in examples} == {1, 2, 3}, seen
    assert len(seen) == sum(size for size, _, _ in examples)
    for size in (1, 2, 3):
        pids = {(rank, pid) for s, rank, pid in seen if s == size}
        assert len(pids) == size, f"one world of {size} ranks, kept across examples: {seen}"
    # The marker's size (2) is the session's world; the others were closed with the test.
    assert not any(alive(pid) for size, _, pid in seen if size != 2), seen
    assert all(alive(pid) for size, _, pid in seen if size == 2), seen
""",
        examples=7,
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2)


def test_a_world_size_strategy_that_can_draw_no_ranks_fails_before_any_example(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    records = str(tmp_path_factory.mktemp("records"))
    _file(
        pytester,
        records,
        """
@QUICK
@given(world_size=st.integers(0, 2))
@pytest.mark.distributed
def test_none(rank, world_size):
    record("none")

@QUICK
@given(world_size=st.sampled_from([1, 2, 3]))
@pytest.mark.distributed
def test_too_many(rank, world_size):
    record("too_many")

@pytest.mark.distributed(world_size=st.integers(1, 2))
@given(n=st.integers(0, 3))
def test_in_the_marker(rank, n):
    record("marker")

@QUICK
@pytest.mark.distributed(world_size=[1, 2])
@given(world_size=st.integers(1, 2))
def test_in_both(rank, world_size):
    record("both")

def test_after():
    assert lines("none") == lines("too_many") == lines("marker") == lines("both") == []
""",
    )
    result = pytester.runpytest("-o", "dist_max_world_size=2", "-p", "no:randomly")
    # test_in_both is one test (no [ws1], [ws2] cases), which fails.
    result.assert_outcomes(failed=4, passed=1)
    out = result.stdout.str()
    # (Brackets are fnmatch's: plain substrings here.)
    for line in (
        "@given(world_size=integers(min_value=0, max_value=2)) can draw 0, not a world size: "
        "a drawn world has 1 to 2 ranks (ini dist_max_world_size = 2)",
        "@given(world_size=sampled_from([1, 2, 3])) can draw 3, more ranks than 2: a drawn "
        "world has 1 to 2 ranks (ini dist_max_world_size = 2)",
        "invalid @pytest.mark.distributed: world_size=integers(min_value=1, max_value=2) is a "
        "Hypothesis strategy; draw it with the test's arguments instead",
        "invalid @pytest.mark.distributed: world_size=[1, 2] in the marker and "
        "@given(world_size=integers(min_value=1, max_value=2)) both give the world size",
    ):
        assert line in out


def test_a_hang_and_an_unpicklable_argument_are_failing_examples(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    records = str(tmp_path_factory.mktemp("records"))
    _file(
        pytester,
        records,
        """
@QUICK
@given(n=st.integers(0, 50))
@pytest.mark.distributed(world_size=2)
def test_hangs(rank, n):
    if n >= 3 and rank == 1:
        return  # rank 0 then waits in the barrier alone
    dist.barrier()

@QUICK
@given(check=st.just(lambda: True))
@pytest.mark.distributed(world_size=2)
def test_unpicklable(rank, check):
    assert check()
""",
        examples=20,
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "WorldHang: the run can never finish: rank 0 waits in a collective*",
            "minimal example (2 ranks, * examples run): test_hangs(n=3)",
        ]
    )
    assert "drawn argument 'check' cannot be sent to the ranks" in out
    assert "DeadlineExceeded" not in out
