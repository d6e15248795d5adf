"""Property tests with faults: a drawn ``fault`` is injected into its example, the marker's
``verify=`` runs after each example that passed, a failing example shrinks to the first
kill point that breaks the code, and the minimal example is confirmed on fresh processes."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")

HEADER = """
import os
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st
from harness import faults
from harness.strategies import faults as drawn_faults

RECORDS = {records!r}

def record(name, text):
    with open(os.path.join(RECORDS, name), "a") as f:
        f.write(f"{{text}}\\n")

def lines(name):
    path = os.path.join(RECORDS, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().split()

def train_or_stop(steps, guarded=range(1, 99)):
    # Collective #n is step n's; a lost peer at a guarded one stops the loop cleanly.
    for step in range(1, steps + 1):
        try:
            dist.all_reduce(torch.ones(2))
        except RuntimeError:  # Gloo: the peer is gone
            if step not in guarded:
                raise
            return "stopped cleanly"
    return "finished"

QUICK = settings(database=None, derandomize=True, max_examples={examples})
"""


def _file(pytester: pytest.Pytester, records: str, body: str, examples: int = 12) -> None:
    pytester.makepyfile(test_faulty=HEADER.format(records=records, examples=examples) + body)


def test_a_drawn_fault_is_injected_in_each_example_and_verify_runs_after_it(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    records = str(tmp_path_factory.mktemp("records"))
    _file(
        pytester,
        records,
        """
def survived(rank, fault):
    # verify=: on a fresh world after each example that passed, with its drawn fault.
    if rank == 0:
        record("verified", "none" if fault is None else fault.at)

@QUICK
@given(fault=st.none() | drawn_faults("kill", ranks=1, at=st.integers(1, 3)))
@pytest.mark.distributed(world_size=2, verify=survived)
def test_the_survivor_stops_cleanly(rank, fault):
    if rank == 0:
        record("ran", "none" if fault is None else fault.at)
    expected = "finished" if fault is None else "stopped cleanly"
    assert train_or_stop(3) == expected

@QUICK
@given(world_size=st.integers(1, 2), fault=drawn_faults("kill", ranks=1, at=1))
@pytest.mark.distributed
def test_a_fault_outside_the_drawn_world_is_rejected(rank, world_size, fault):
    record("sizes", world_size)
    assert train_or_stop(1) == "stopped cleanly"

def test_after():
    assert set(lines("ran")) == {"none", "1", "2", "3"}, lines("ran")
    assert sorted(lines("verified")) == sorted(lines("ran")), lines("verified")
    assert set(lines("sizes")) == {"2"}, lines("sizes")
""",
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=3)


def test_a_kill_point_the_code_does_not_survive_shrinks_to_the_first_one(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    records = str(tmp_path_factory.mktemp("records"))
    _file(
        pytester,
        records,
        """
def checkpoint_is_whole(rank, fault):
    # The planted bug verify= finds: a kill at #2 or later leaves a torn checkpoint.
    assert fault is None or fault.at < 2, "torn checkpoint"

@QUICK
@given(fault=drawn_faults("kill", ranks=[1, 0], at=st.integers(1, 5)))
@pytest.mark.distributed(world_size=2)
def test_guarded(rank, fault):
    # The planted bug: collective #4, a checkpoint's barrier, is not guarded.
    assert train_or_stop(5, guarded=(1, 2, 3, 5)) == "stopped cleanly"

@QUICK
@given(fault=drawn_faults("kill", ranks=1, at=st.integers(1, 3)))
@pytest.mark.distributed(world_size=2, verify=checkpoint_is_whole)
def test_verified(rank, fault):
    assert train_or_stop(3) == "stopped cleanly"
""",
        examples=20,
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*rank 0 raised RuntimeError*rank 1 killed (SIGKILL) before collective #4*",
            "minimal example (2 ranks, * examples run): "
            "test_guarded(fault=faults.kill(rank=1, at=4))",
            "to replay it first, add above @given: @example(fault=faults.kill(rank=1, at=4))",
            "confirmed on fresh processes; run (2 ranks, gloo): "
            "pytest test_faulty.py::test_guarded --dist-backend=gloo",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            # The kill point's collective, as the example's run found it.
            "*verify checkpoint_is_whole failed after kill(rank=1, at=2) (collective #2: "
            "all_reduce at test_faulty.py:*)*",
            "minimal example (2 ranks, * examples run): "
            "test_verified(fault=faults.kill(rank=1, at=2))",
        ]
    )


def test_a_bad_drawn_fault_names_itself_and_confirm_off_leaves_no_note(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    records = str(tmp_path_factory.mktemp("records"))
    _file(
        pytester,
        records,
        """
@QUICK
@given(fault=st.just("kill rank 1"))
@pytest.mark.distributed(world_size=2)
def test_not_a_fault(rank, fault):
    pass

@QUICK
@given(n=st.integers(0, 9))
@pytest.mark.distributed(world_size=2)
def test_fails(rank, n):
    assert n < 1
""",
    )
    result = pytester.runpytest("-p", "no:randomly", "-o", "dist_confirm=off")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert (
        "drawn argument 'fault' must be a fault made by harness.faults, a list of them, or "
        "None (draw it with harness.strategies.faults), not 'kill rank 1'"
    ) in out
    result.stdout.fnmatch_lines(["run (2 ranks, gloo): pytest test_faulty.py::test_fails *"])
    assert "confirmed on fresh processes" not in out
