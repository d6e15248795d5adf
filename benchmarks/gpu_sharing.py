"""GPU acceptance, rows (g): several NCCL ranks on one GPU (``ranks_per_gpu``).

Used by ``gpu_acceptance.py``, which passes itself in as ``acc`` (its children, project
writer and parsers), so that this module imports nothing of it. The rows, all on the run's
first GPU:

* (g1) ``python -m harness check --backend nccl --world-size 2 --ranks-per-gpu 2``;
* (g2) the same with 4 ranks and ``--ranks-per-gpu 4``;
* (g3) ``--tests`` tests of a 2-rank NCCL world with ``ranks_per_gpu=2`` on a reused world:
  their per-test cost (pytest's durations, from JUnit XML);
* (g4) a planted desync (rank 0 ``SUM``, rank 1 ``MAX``) on such a world: the test must fail
  with the verdict naming both ranks' collectives.

They need torch 2.15 or later and its NCCL 2.30 or later (``NCCL_MULTI_RANK_GPU_ENABLE``);
elsewhere each row is a SKIP that says which of the two is missing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

NEEDED_NCCL = (2, 30)
NEEDED_TORCH = (2, 15)
CHECK_TIMEOUT_S = 240.0
REUSED_TIMEOUT_S = 300.0
DESYNC_TIMEOUT_S = 180.0

SHARED_TESTS = """\
import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, backend="nccl", ranks_per_gpu=2)
@pytest.mark.parametrize("i", range({count}))
def test_shared(rank, local_device, i):
    t = torch.ones(4, device=local_device)
    dist.all_reduce(t)
    assert t[0].item() == 2.0
"""

DESYNC_TEST = """\
import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, backend="nccl", ranks_per_gpu=2)
def test_desync(rank, local_device):
    t = torch.ones(4, device=local_device) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)
"""

DESYNC_VERDICT = re.compile(
    r"collective #1 on the default group differs: rank 0 all_reduce\(SUM, float32\[4\]\).*"
    r"rank 1 all_reduce\(MAX, float32\[4\]\)"
)


def version_text(version: tuple[int, ...] | None) -> str:
    """``"2.30.7"``, or ``"none"`` where torch has no NCCL."""
    return ".".join(map(str, version)) if version else "none"


def torch_numbers(version: str) -> tuple[int, ...]:
    """The leading numbers of a torch version (``"2.15.0+cu132"``: ``(2, 15, 0)``)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def blocker(torch_version: str, nccl: tuple[int, ...] | None) -> str | None:
    """Why the rows cannot run here (torch older than 2.15, NCCL older than 2.30); None if
    they can."""
    problems = []
    if torch_numbers(torch_version) < NEEDED_TORCH:
        problems.append(f"torch {torch_version} is older than 2.15")
    if nccl is None or tuple(nccl) < NEEDED_NCCL:
        problems.append(f"NCCL {version_text(nccl)} is older than 2.30")
    return "; ".join(problems) or None


def row_names(tests: int) -> list[str]:
    return [
        "(g1) harness check, 2 NCCL ranks on 1 GPU",
        "(g2) harness check, 4 NCCL ranks on 1 GPU",
        f"(g3) {tests} tests, 2 ranks on 1 GPU, reused world",
        "(g4) planted desync, 2 ranks on 1 GPU",
    ]


def rows(
    acc: Any, work: Path, gpu: str, tests: int, torch_version: str, nccl: tuple[int, ...] | None
) -> list[Any]:
    """The rows (g), as ``acc.Row``; each a SKIP naming why where :func:`blocker` says so.

    Args:
        acc: The ``gpu_acceptance`` module.
        gpu: The GPU the rows run on (``CUDA_VISIBLE_DEVICES`` of their children).
    """
    names = row_names(tests)
    why = blocker(torch_version, nccl)
    if why is not None:
        return [acc.Row(name, acc.SKIP, why) for name in names]
    found = [_check(acc, names[0], gpu, 2), _check(acc, names[1], gpu, 4)]
    return [*found, _reused(acc, names[2], work, gpu, tests), _desync(acc, names[3], work, gpu)]


def _check(acc: Any, name: str, gpu: str, ranks: int) -> Any:
    argv = [sys.executable, "-m", "harness", "check", "--backend", "nccl"]
    argv += ["--world-size", str(ranks), "--ranks-per-gpu", str(ranks)]
    done = acc.run(argv, timeout=CHECK_TIMEOUT_S, cwd=acc.REPO, env=acc.child_env(gpu))
    last = next((line for line in reversed(done.output.splitlines()) if line.strip()), "")
    numbers = f"{done.seconds:.1f} s: {last.strip()}"
    if done.returncode != 0 or done.timed_out:
        return acc.Row(name, acc.FAIL, f"{done.why(CHECK_TIMEOUT_S)}; {numbers}")
    return acc.Row(name, acc.PASS, numbers)


def _reused(acc: Any, name: str, work: Path, gpu: str, tests: int) -> Any:
    project = work / "shared"
    acc.write_project(project, {"test_shared.py": SHARED_TESTS.format(count=tests)})
    junit = project / "shared.xml"
    argv = acc.pytest_argv("-q", "--dist-require-gpus", f"--junitxml={junit}")
    done = acc.run(argv, timeout=REUSED_TIMEOUT_S, cwd=project, env=acc.child_env(gpu))
    counts = acc.parse_outcomes(done.output)
    if done.returncode != 0 or done.timed_out or counts.get("passed") != tests:
        return acc.Row(name, acc.FAIL, f"{done.why(REUSED_TIMEOUT_S)}; {counts}")
    times = acc.parse_junit_times(junit.read_text(encoding="utf-8"))
    first = times[0] if times else float("nan")
    detail = (
        f"per test (median) {acc.ms(acc.median(times))}; first test {acc.ms(first)}; "
        f"wall {done.seconds:.1f} s"
    )
    return acc.Row(name, acc.PASS, detail)


def _desync(acc: Any, name: str, work: Path, gpu: str) -> Any:
    project = work / "desync"
    acc.write_project(project, {"test_desync.py": DESYNC_TEST})
    argv = acc.pytest_argv("-q", "-o", "dist_confirm=off")
    done = acc.run(argv, timeout=DESYNC_TIMEOUT_S, cwd=project, env=acc.child_env(gpu))
    counts = acc.parse_outcomes(done.output)
    if done.timed_out or counts.get("failed") != 1:
        return acc.Row(name, acc.FAIL, f"{done.why(DESYNC_TIMEOUT_S)}; {counts}")
    if not DESYNC_VERDICT.search(" ".join(done.output.split())):
        return acc.Row(name, acc.FAIL, "the test failed without the desync verdict")
    return acc.Row(name, acc.PASS, "failed with the verdict naming SUM on rank 0, MAX on rank 1")


def self_check() -> None:
    """The decisions on sample values (no GPU); AssertionError if one is off."""
    assert blocker("2.15.0+cu132", (2, 30, 7)) is None
    assert blocker("2.13.0", (2, 27, 5)) == (
        "torch 2.13.0 is older than 2.15; NCCL 2.27.5 is older than 2.30"
    )
    assert blocker("2.15.0", None) == "NCCL none is older than 2.30"
    assert torch_numbers("2.15.0a0+git1234") == (2, 15, 0)
    verdict = (
        "collective #1 on the default group differs: rank 0 all_reduce(SUM, float32[4]) at "
        "test_desync.py:9; rank 1 all_reduce(MAX, float32[4]) at test_desync.py:9"
    )
    assert DESYNC_VERDICT.search(verdict)
