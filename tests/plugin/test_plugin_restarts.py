"""The marker's ``restarts``: a test whose rank dies runs again on fresh ranks, as under
torchrun's ``--max-restarts``, and resumes from what its first attempt saved."""

from __future__ import annotations

import pytest

RESUMES = """
import json, os
import pytest
import torch
import torch.distributed as dist
from harness import faults

STEPS = 5


def train(directory, restart_count):
    # Resume from the last complete checkpoint, as a training script does after a restart.
    path = os.path.join(directory, "checkpoint.json")
    state = {"step": 0, "total": 0.0}
    if os.path.exists(path):
        with open(path) as f:
            state = json.load(f)
    for step in range(state["step"], STEPS):
        grad = torch.ones(1)
        dist.all_reduce(grad)  # collective #(step - resumed + 1) of this attempt
        state = {"step": step + 1, "total": state["total"] + grad.item()}
        dist.barrier()
        if dist.get_rank() == 0:
            with open(path + ".tmp", "w") as f:
                json.dump(state, f)
            os.replace(path + ".tmp", path)
        dist.barrier()
    return state


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    return str(tmp_path_factory.mktemp("checkpoints"))


@pytest.mark.distributed(world_size=2, restarts=1, faults=[faults.kill(rank=1, at=5)])
def test_resumes_after_a_lost_rank(rank, restart_count, shared):
    state = train(shared, restart_count)
    assert state == {"step": STEPS, "total": 2.0 * STEPS}
    assert restart_count == 1  # the first attempt lost rank 1


@pytest.mark.distributed(world_size=3, restarts=[2], faults=[faults.kill(rank=2, at=1)])
def test_resized_on_restart(rank, world_size, restart_count):
    assert world_size == (2 if restart_count else 3)
    dist.all_reduce(torch.ones(1))


@pytest.mark.distributed(
    world_size=2,
    restarts=1,
    faults=[faults.kill(rank=1, at=1), faults.exit(rank=0, at=1, code=3, attempt=1)],
)
def test_out_of_restarts(rank):
    dist.all_reduce(torch.ones(1))
"""


def test_restarts_resume_resize_and_run_out(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_restart_examples=RESUMES)
    result = pytester.runpytest("-p", "no:randomly", "-rP")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_resumes_after_a_lost_rank _*",
            "*- Captured attempts call -*",
            "attempt 0 (2 ranks): rank 0 raised RuntimeError: *; rank 1 killed (SIGKILL) before "
            "collective #5 (barrier at test_restart_examples.py:*) on the default group "
            "(injected)",
            "attempt 1 (2 ranks): passed",
            "*_ test_resized_on_restart _*",
            "*- Captured attempts call -*",
            "attempt 0 (3 ranks): *rank 2 killed (SIGKILL) before collective #1 (all_reduce "
            "at test_restart_examples.py:*) on the default group (injected)",
            "attempt 1 (2 ranks): passed",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "RankError: rank 1 raised RuntimeError: *; rank 0 exited with code 3 before "
            "collective #1 (all_reduce at test_restart_examples.py:*) on the default group "
            "(injected)",
            "*- attempts -*",
            "attempt 0 (2 ranks): *rank 1 killed (SIGKILL) before collective #1 (all_reduce "
            "at test_restart_examples.py:*) on the default group (injected)",
        ]
    )
    failure = result.stdout.str().split("_ test_out_of_restarts _", 1)[1].split("PASSES")[0]
    assert "Captured attempts" not in failure, "a failure lists its earlier attempts once"


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("restarts=-1", "restarts must be >= 0, got -1"),
        ("restarts='2'", "restarts must be a number of restarts (an int >= 0) or the world size"),
        ("restarts=[0]", "restarts has world size 0; each must be >= 1"),
        (
            "faults=[faults.kill(rank=1, at=1, attempt=1)]",
            "fault kill(rank=1, at=1, attempt=1) acts in attempt 1, but the run has 0 restarts",
        ),
        (
            "restarts=[1], faults=[faults.kill(rank=1, at=1, attempt=1)]",
            "fault kill(rank=1, at=1, attempt=1): rank 1 is not in a world of 1",
        ),
    ],
)
def test_bad_restarts_fail_the_test_naming_them(
    pytester: pytest.Pytester, marker: str, message: str
) -> None:
    pytester.makepyfile(
        test_bad=f"""
        import pytest
        from harness import faults

        @pytest.mark.distributed(world_size=2, {marker})
        def test_bad(rank):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*invalid @pytest.mark.distributed: {message}*"])
