"""pytest under torchrun (``python -m torch.distributed.run ... -m pytest``): each pytest
process is a rank of the launcher's world. Every rank reaches the same outcome for each test;
what a harness world gives a test is given alike (one ``tmp_path`` for the ranks of a test,
the test's seed, the ``collectives`` fixture, Hypothesis's examples drawn and judged alike);
what only the harness's own ranks can give is skipped, saying why. Real torchrun, real Gloo.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from env_testutil import LAUNCH_MARKER, kill_marked

# Bound on one torchrun run: generous, these take seconds (mostly importing torch).
SUBPROCESS_TIMEOUT_S = 300

LAUNCHED_CONFTEST = """
import os

OUT = {out!r}

def pytest_runtest_logreport(report):
    if report.when == "call" or not report.passed:
        with open(os.path.join(OUT, f"outcomes-{{os.environ['RANK']}}.txt"), "a") as f:
            f.write(f"{{report.nodeid.split('::')[-1]}} {{report.when}} {{report.outcome}}\\n")

def pytest_sessionfinish(session, exitstatus):
    with open(os.path.join(OUT, f"exit-{{os.environ['RANK']}}.txt"), "w") as f:
        f.write(str(int(exitstatus)))
    # torchrun tears down all ranks as soon as one exits non-zero: exit 0 so that the other
    # rank can finish writing its outcomes (the real status is in exit-RANK.txt).
    session.exitstatus = 0
"""

LAUNCHED_TESTS = """
import os
import pytest
import torch
import torch.distributed as dist
from harness import faults

@pytest.mark.distributed(world_size=2)
def test_two(rank, world_size, local_rank, local_device):
    assert rank == int(os.environ["RANK"]) == dist.get_rank()
    assert world_size == 2 and local_rank == int(os.environ["LOCAL_RANK"])
    assert local_device == torch.device("cpu")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2

@pytest.mark.distributed(world_size=4)
def test_four(rank):
    pass

@pytest.mark.distributed(world_size=2)
def test_fails_on_rank_1(rank):
    assert rank == 0

@pytest.mark.distributed(world_size=2)
def test_after_failure(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2

@pytest.mark.distributed(world_size=2)
def test_skips_on_rank_1(rank):
    if rank == 1:
        pytest.skip("rank 1 only")

@pytest.mark.distributed(world_size=2)
def test_skips_everywhere(rank):
    pytest.skip("nowhere")

@pytest.mark.distributed(world_size=2, backend="gloo")
def test_gloo(rank):
    assert dist.get_backend() == "gloo"

@pytest.mark.distributed(world_size=2, backend="nccl")
def test_nccl(rank):
    pass

@pytest.mark.distributed(world_size=2, init=False)
def test_initless(rank):
    pass

@pytest.mark.distributed(world_size=2, restarts=1)
def test_restarts(rank):
    pass

@pytest.mark.distributed(world_size=2, faults=[faults.kill(rank=1, at=1)])
def test_faults(rank):
    dist.barrier()

def test_dist_world_still_spawns(dist_world):
    world = dist_world(1)
    assert world.run(os.getpid) != [os.getpid()]
    assert world.run(dist.get_world_size) == [1]

def test_plain():
    pass
"""

LAUNCHED_EXPECTED = [
    "test_two call passed",
    "test_four call skipped",
    "test_fails_on_rank_1 call failed",
    "test_after_failure call passed",
    "test_skips_on_rank_1 call failed",
    "test_skips_everywhere call skipped",
    "test_gloo call passed",
    "test_nccl call skipped",
    "test_initless call skipped",
    "test_restarts call skipped",
    "test_faults call skipped",
    "test_dist_world_still_spawns call passed",
    "test_plain call passed",
]


def _torchrun(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tests: str, expected: list[str]
) -> tuple[pytest.RunResult, Path]:
    """Run pytest under torchrun on two ranks, on ``tests`` (written as test_launched.py,
    ``{out}`` filled in), each rank noting its outcomes in the folder ``out`` returned (see
    LAUNCHED_CONFTEST), which must be ``expected`` on both. Whatever happens, none of its
    processes is left running."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the launched world is Gloo everywhere
    marker = uuid.uuid4().hex
    monkeypatch.setenv(LAUNCH_MARKER, marker)
    out = pytester.mkdir("out")
    pytester.makeconftest(LAUNCHED_CONFTEST.format(out=str(out)))
    pytester.makepyfile(test_launched=tests.replace("{out}", repr(str(out))))
    try:
        result = pytester.run(
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rA",
            "test_launched.py",
            timeout=SUBPROCESS_TIMEOUT_S,
        )
    finally:
        kill_marked(marker)  # torchrun's workers, in sessions of their own, after a timeout
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    for rank in (0, 1):
        assert (out / f"outcomes-{rank}.txt").read_text().splitlines() == expected, rank
    return result, out


def test_under_torchrun_every_rank_reaches_the_same_outcome(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, out = _torchrun(pytester, monkeypatch, LAUNCHED_TESTS, LAUNCHED_EXPECTED)
    assert [(out / f"exit-{rank}.txt").read_text() for rank in (0, 1)] == ["1", "1"]
    text = result.stdout.str()
    assert "failed on other ranks: rank 1: AssertionError: assert 1 == 0" in text
    assert "skipped on ranks 1 only: rank 1 only" in text
    assert "needs world size 4; the launcher's world has 2" in text
    assert "needs backend 'nccl'; the launcher's world uses 'gloo'" in text
    assert "needs ranks without a process group (init=False); under the launcher" in text
    assert "needs restarts, which end and start the test's ranks; under the launcher" in text
    assert "needs faults, which end and start the test's ranks; under the launcher" in text


ALIKE_TESTS = """
import os
import random

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st

from harness import faults, strategies

OUT = {out}


def note(name, rank, value):
    with open(os.path.join(OUT, f"{name}-{rank}"), "w") as f:
        f.write(str(value))


@pytest.fixture
def checkpoints(tmp_path):
    return tmp_path / "checkpoints"


@pytest.mark.distributed(world_size=2)
def test_resume_from_rank_0s_checkpoint(rank, tmp_path, checkpoints):
    note("tmp_path", rank, tmp_path)
    if rank == 0:
        checkpoints.mkdir()
        torch.save({"step": 7}, checkpoints / "last.pt")
    dist.barrier()
    assert torch.load(checkpoints / "last.pt")["step"] == 7


def test_plain(tmp_path):
    note("plain", os.environ["RANK"], tmp_path)
    (tmp_path / "mine").mkdir()  # no other rank made it: the directory is this rank's


@pytest.mark.distributed(world_size=2)
def test_seeded_alike(rank):
    drawn = [None, None]
    dist.all_gather_object(drawn, random.random())
    assert drawn[0] == drawn[1]


@pytest.mark.distributed(world_size=2)
def test_collectives(rank, collectives):
    dist.all_reduce(torch.ones(2))
    dist.broadcast(torch.ones(1), src=0)
    assert [c.op for c in collectives] == ["all_reduce", "broadcast"]


@pytest.mark.distributed(world_size=2)
@settings(max_examples=20)
@given(n=st.integers(1, 8))
def test_property(rank, n, collectives):
    t = torch.full((n,), float(rank))
    dist.all_reduce(t)
    assert t.tolist() == [1.0] * n
    assert len(collectives) == 1


@pytest.mark.distributed(world_size=2)
@given(n=st.integers(0, 1000))
def test_property_fails_on_rank_1(rank, n):
    dist.all_reduce(torch.ones(1))
    assert rank == 0 or n < 3


@pytest.mark.distributed(world_size=2)
def test_after_the_failure(rank):
    dist.barrier()


@pytest.mark.distributed(world_size=2, faults=faults.sweep("kill", ranks="all", at="all"))
def test_sweep_over_all(rank):
    dist.barrier()


@pytest.mark.distributed(world_size=2)
@given(world_size=st.integers(1, 2))
def test_drawn_world_size(rank, world_size):
    pass


@pytest.mark.distributed(world_size=2)
@given(fault=strategies.faults("kill", ranks=1, at=1))
def test_drawn_fault(rank, fault):
    dist.barrier()
"""

ALIKE_EXPECTED = [
    "test_resume_from_rank_0s_checkpoint call passed",
    "test_plain call passed",
    "test_seeded_alike call passed",
    "test_collectives call passed",
    "test_property call passed",
    "test_property_fails_on_rank_1 call failed",
    "test_after_the_failure call passed",
    "test_sweep_over_all call skipped",
    "test_drawn_world_size call skipped",
    "test_drawn_fault call skipped",
]


def test_under_torchrun_a_test_gets_what_a_harness_world_gives(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, out = _torchrun(pytester, monkeypatch, ALIKE_TESTS, ALIKE_EXPECTED)
    shared = [(out / f"tmp_path-{rank}").read_text() for rank in (0, 1)]
    assert shared[0] == shared[1], "the ranks of a distributed test share its tmp_path"
    own = [(out / f"plain-{rank}").read_text() for rank in (0, 1)]
    assert own[0] != own[1], "each rank running a plain test has a tmp_path of its own"
    text = result.stdout.str()
    # Both ranks shrank the same failure to the same minimal example, then went on.
    failure = "RankError: rank 1 raised AssertionError: assert (1 == 0 or 3 < 3)"
    assert text.count(failure) == 2, text
    assert text.count("    n=3,") == 2, text
    assert "needs a clean run on ranks the harness starts, to count sweep('kill'" in text
    assert "draws its world size (@given(world_size=...)); the launcher's world has" in text
    assert "draws faults (@given(fault=...)), which end and start the test's ranks" in text
