"""The plugin with other tools, each in a pytest of its own (a subprocess): pytest-xdist,
pytest-cov, an external launcher (torchrun), and the downstream example project."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Bound on one subprocess pytest run: generous, these take seconds (mostly importing torch).
SUBPROCESS_TIMEOUT_S = 300

OPS = """\
import torch
import torch.distributed as dist


def rank_sum(x):
    t = torch.tensor([float(x)])
    dist.all_reduce(t)
    return t.item()


def fails_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("rank 1")
    return "rank 0"


def never_called():
    return "never"
"""


def _coverage_project(pytester: pytest.Pytester) -> None:
    pytester.mkpydir("mypkg")
    pytester.path.joinpath("mypkg", "ops.py").write_text(OPS)
    pytester.makepyfile(
        test_ops="""
        import os
        import pytest
        from mypkg.ops import fails_on_rank_1, rank_sum

        @pytest.mark.distributed(world_size=[1, 2, 3])
        def test_sum(rank, world_size):
            print(f"rank {rank} of {world_size} says hello")
            assert rank_sum(rank + 1) == world_size * (world_size + 1) / 2

        @pytest.mark.distributed(world_size=2)
        @pytest.mark.parametrize("k", range(3))
        def test_sum_again(rank, k):
            assert rank_sum(k) == 2 * k

        @pytest.mark.distributed(world_size=2)
        def test_failure_is_measured_too(rank):
            fails_on_rank_1()

        @pytest.mark.distributed(world_size=2, isolate=True)
        def test_isolated(rank):
            assert rank_sum(1) == 2

        def test_controller_only():
            assert os.environ.get("RANK") is None
        """
    )


def _missing_lines(stdout: str) -> str:
    """The "Missing" column of mypkg/ops.py in a term-missing coverage report."""
    for line in stdout.splitlines():
        if line.startswith(os.path.join("mypkg", "ops.py")):
            parts = line.split(None, 4)
            return parts[4].strip() if len(parts) > 4 else ""
    raise AssertionError(f"no coverage line for mypkg/ops.py in:\n{stdout}")


COVERAGE = ["--cov=mypkg", "--cov-report=term-missing"]


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(["-s", *COVERAGE], id="cov-no-capture"),
        # xdist's "auto" worker count (bounded, for small machines and big ones alike), with
        # coverage: the harness reads neither the count nor how it was given.
        pytest.param(["-n", "auto", "--maxprocesses", "2", *COVERAGE], id="xdist-auto-cov"),
    ],
)
def test_xdist_and_coverage_need_no_configuration(
    pytester: pytest.Pytester, options: list[str]
) -> None:
    _coverage_project(pytester)
    result = pytester.runpytest_subprocess(
        *options, "-p", "no:cacheprovider", timeout=SUBPROCESS_TIMEOUT_S
    )
    result.assert_outcomes(passed=8, failed=1)
    result.stdout.fnmatch_lines(["RankError: rank 1 raised ValueError: rank 1"])
    # Each kind of world's peak memory per rank: under xdist, the workers' worlds together.
    result.stdout.fnmatch_lines(
        [
            "harness: worlds of 2 ranks (gloo), peak resident memory per rank: * MiB (rank 0), "
            "* MiB (rank 1); * worlds, 0 replaced for memory"
        ]
    )
    if "-n" in options:
        result.stdout.fnmatch_lines(["*worker* [[]9 items[]]*"])
    else:
        # -s: the ranks' output is not captured, it reaches the terminal as it is printed.
        for rank in range(3):
            result.stdout.fnmatch_lines([f"*rank {rank} of 3 says hello*"])
        assert "Captured rank" not in result.stdout.str()
    if "--cov=mypkg" in options:
        # Lines run only inside ranks count, also those of a failed run; only never_called's
        # body (line 18) was never run anywhere.
        assert _missing_lines(result.stdout.str()) == "18"
        assert (pytester.path / ".coverage").is_file()
    left = glob.glob(str(pytester.path / "**" / ".coverage*"), recursive=True)
    if "--cov=mypkg" in options:
        left.remove(str(pytester.path / ".coverage"))
    assert not left, f"coverage data files left behind: {left}"


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


def test_under_torchrun_every_rank_reaches_the_same_outcome(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the launched world is Gloo everywhere
    out = pytester.mkdir("out")
    pytester.makeconftest(LAUNCHED_CONFTEST.format(out=str(out)))
    pytester.makepyfile(test_launched=LAUNCHED_TESTS)
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
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    outcomes = {rank: (out / f"outcomes-{rank}.txt").read_text().splitlines() for rank in (0, 1)}
    assert outcomes[0] == LAUNCHED_EXPECTED
    assert outcomes[1] == LAUNCHED_EXPECTED
    assert [(out / f"exit-{rank}.txt").read_text() for rank in (0, 1)] == ["1", "1"]
    text = result.stdout.str()
    assert "failed on other ranks: rank 1: AssertionError: assert 1 == 0" in text
    assert "skipped on ranks 1 only: rank 1 only" in text
    assert "needs world size 4; the launcher's world has 2" in text
    assert "needs backend 'nccl'; the launcher's world uses 'gloo'" in text
    assert "needs ranks without a process group (init=False); under the launcher" in text
    assert "needs restarts, which end and start the test's ranks; under the launcher" in text
    assert "needs faults, which end and start the test's ranks; under the launcher" in text


def test_the_downstream_example_passes(tmp_path: Path) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("COV_CORE_", "COVERAGE_", "PYTEST_"))
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave nothing behind in examples/
    log = tmp_path / "log.txt"
    with open(log, "w") as handle:
        # Output to a file: rank processes' forkserver may hold a pipe open after pytest ends.
        completed = subprocess.run(
            [sys.executable, "-m", "pytest", "examples/downstream", "-q", "-p", "no:cacheprovider"],
            cwd=REPO,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            timeout=SUBPROCESS_TIMEOUT_S,
            check=False,
        )
    output = log.read_text()
    assert completed.returncode == 0, output
    assert " passed" in output
    assert "failed" not in output
    assert "error" not in output
