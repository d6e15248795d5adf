"""The plugin with other tools, each in a pytest of its own (a subprocess): pytest-xdist,
pytest-cov, and the downstream example project (torchrun: ``test_plugin_torchrun.py``)."""

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
