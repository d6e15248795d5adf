"""ini ``dist_preload``: the project's warm-up runs once in the forkserver, before it forks any
rank, so that every rank (of a fresh world, of one rebuilt after a fault) starts warm. Each
inner run is a subprocess: this process's forkserver is running already, and a server's
preload is fixed when it starts."""

from __future__ import annotations

from pathlib import Path

import pytest

WARM = """
import os

warmed_in = None


def warm_up():
    global warmed_in
    warmed_in = os.getpid()
    with open(os.environ["WARM_LOG"], "a") as log:
        log.write(f"{os.getpid()}\\n")
"""

TESTS = """
import os
import pytest
import torch
import torch.distributed as dist
import warm
from harness import faults


def check(rank):
    # Done in the server: this rank inherited it, and did not run it.
    assert warm.warmed_in is not None
    assert warm.warmed_in != os.getpid()


@pytest.mark.distributed(world_size=2, backend="gloo")
def test_reused(rank):
    check(rank)


@pytest.mark.distributed(world_size=2, backend="gloo", isolate=True)
def test_fresh(rank):
    check(rank)


@pytest.mark.distributed(world_size=2, backend="gloo", faults=[faults.kill(1, 1)])
def test_after_a_fault(rank):
    check(rank)
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError:
        pass


@pytest.mark.distributed(world_size=2, backend="gloo")
def test_rebuilt(rank):
    check(rank)
"""


def test_the_warm_up_runs_once_in_the_server_and_every_rank_inherits_it(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "warm.log"
    monkeypatch.setenv("WARM_LOG", str(log))
    pytester.makepyfile(warm=WARM, test_preload=TESTS)
    pytester.makeini("[pytest]\npythonpath = .\ndist_preload = torch.optim, warm:warm_up\n")
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=4)
    assert len(log.read_text().splitlines()) == 1, "called once, in the server alone"


def test_an_entry_that_fails_in_the_server_fails_each_distributed_test_naming_it(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARM_LOG", str(tmp_path / "warm.log"))
    pytester.makepyfile(
        warm=WARM,
        test_preload="""
        import pytest

        def test_plain():
            pass

        @pytest.mark.distributed(world_size=1, backend="gloo")
        @pytest.mark.parametrize("i", range(2))
        def test_distributed(rank, i):
            pass
        """,
    )
    pytester.makeini("[pytest]\npythonpath = .\ndist_preload = warm:warm_upp no_such_module\n")
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*ini dist_preload failed in the forkserver, which ranks are forked from: "
            # Python 3.10 and 3.12+ add "Did you mean: 'warm_up'?" to the error's line.
            "warm:warm_upp: AttributeError: module 'warm' has no attribute 'warm_upp'*; "
            "no_such_module: ModuleNotFoundError: No module named 'no_such_module'"
        ]
    )


@pytest.mark.parametrize("entry", ["my-lib", "mylib:warm:up", "mylib:", ".mylib"])
def test_an_entry_that_is_no_module_or_function_is_a_usage_error(
    pytester: pytest.Pytester, entry: str
) -> None:
    pytester.makeini(f"[pytest]\ndist_preload = torch {entry}\n")
    pytester.makepyfile(test_none="def test_nothing(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: ini option dist_preload has {entry!r}; each entry must be a module*"]
    )
