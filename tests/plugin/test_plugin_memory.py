"""Memory on reused worlds through the plugin: a module whose tests keep memory is named, a
rank above ``--dist-max-rank-memory`` gets its world replaced before the next test while every
test passes (marked tests, ``--dist-mptc`` cases and ``@given`` examples alike), the summary
gives each kind of world's peak per rank, and a limit that cannot work is a usage error."""

from __future__ import annotations

import re

import pytest
from plugin_testutil import TWO_RANKS

import harness

MiB = 2**20

KEEPS = """
import pytest
import torch

KEPT = []

@pytest.mark.distributed(world_size=2)
@pytest.mark.parametrize("i", range({tests}))
def test_keeps(i, rank):
    KEPT.append(torch.ones(2**19))  # 2 MiB a test, never freed
"""

REPLACED = re.compile(
    r"harness: after test (\S+), rank 0 holds [\d.]+ MiB, rank 1 holds [\d.]+ MiB, above "
    r"max_rank_memory \([\d.]+ MiB\): the world of 2 ranks \(gloo\) was replaced by fresh "
    r"processes"
)


@pytest.fixture(scope="module")
def limit() -> int:
    """A limit 48 MiB above what a rank of this process's forkserver starts with."""
    with harness.World(2, backend="gloo") as world:
        return max(m.start for m in world.memory.values()) + 48 * MiB


def _replacements(result: pytest.RunResult) -> list[str]:
    """The tests after which a world was replaced, as the lines saying so name them."""
    return [found.group(1) for found in REPLACED.finditer(result.stdout.str())]


def test_a_module_whose_tests_each_keep_memory_is_named_within_its_first_100_tests(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_leaky=KEEPS.format(tests=100))
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=100)
    found = re.search(
        r"RuntimeWarning: test test_leaky.py::test_keeps\[(\d+)\] left behind in a reused "
        r"rank: ranks? .*resident memory grew by [\d.]+ MiB over its last \d+ calls and "
        r"stayed after a garbage collection and giving freed memory back.*Tensor \+\d+",
        result.stdout.str(),
    )
    assert found, result.stdout.str()
    assert int(found.group(1)) < 100


def test_a_world_above_the_limit_is_replaced_before_the_next_test_and_every_test_passes(
    pytester: pytest.Pytester, limit: int
) -> None:
    pytester.makepyfile(test_leaky=KEEPS.format(tests=60))
    result = pytester.runpytest(
        "-p", "no:randomly", f"--dist-max-rank-memory={limit}", "-W", "ignore::RuntimeWarning"
    )
    result.assert_outcomes(passed=60)
    after = _replacements(result)
    assert len(after) >= 2, result.stdout.str()
    assert all(test.startswith("test_leaky.py::test_keeps[") for test in after)
    summary = re.search(
        r"harness: worlds of 2 ranks \(gloo\), peak resident memory per rank: ([\d.]+) MiB "
        r"\(rank 0\), ([\d.]+) MiB \(rank 1\); 1 world, (\d+) replaced for memory",
        result.stdout.str(),
    )
    assert summary, result.stdout.str()
    assert int(summary.group(3)) == len(after)
    assert all(float(peak) * MiB < limit + 16 * MiB for peak in summary.groups()[:2])


def test_mptc_cases_above_the_limit_get_their_world_replaced(
    pytester: pytest.Pytester, limit: int, torch_test_modules: None, environment_restored: None
) -> None:
    pytester.makepyfile(
        test_cases=TWO_RANKS
        + """
KEPT = []


class Keeps(TwoRanks):
    pass


def _keep(self):
    KEPT.append(torch.ones(2**19))


for i in range(40):
    setattr(Keeps, f"test_keeps_{i:02d}", _keep)
"""
    )
    result = pytester.runpytest(
        "-p", "no:randomly", "--dist-mptc", f"--dist-max-rank-memory={limit}",
        "-W", "ignore::RuntimeWarning",
    )  # fmt: skip
    result.assert_outcomes(passed=40)
    after = _replacements(result)
    assert after
    assert all(test.startswith("test_cases.py::Keeps::test_keeps_") for test in after)
    result.stdout.fnmatch_lines(
        ["harness: worlds of 2 ranks (gloo, no default group), peak resident memory*"]
    )


def test_given_examples_above_the_limit_get_their_world_replaced(
    pytester: pytest.Pytester, limit: int
) -> None:
    pytest.importorskip("hypothesis")
    pytester.makepyfile(
        test_props="""
import pytest
import torch
from hypothesis import given, settings, strategies as st

KEPT = []

@settings(database=None, derandomize=True, max_examples=60)
@given(n=st.integers(0, 1000))
@pytest.mark.distributed(world_size=2)
def test_keeps(n, rank):
    KEPT.append(torch.full((2**19,), float(n)))
"""
    )
    result = pytester.runpytest(
        "-p", "no:randomly", f"--dist-max-rank-memory={limit}", "-W", "ignore::RuntimeWarning"
    )
    result.assert_outcomes(passed=1)
    assert _replacements(result)
    assert set(_replacements(result)) == {"test_props.py::test_keeps"}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--dist-max-rank-memory=lots"], "--dist-max-rank-memory must be a size"),
        (["-o", "dist_max_rank_memory=2 parsecs"], "ini option dist_max_rank_memory must be"),
        (["-o", "dist_memory_growth=-5MiB"], "ini option dist_memory_growth must be a size"),
    ],
)
def test_a_limit_that_is_not_a_size_is_a_usage_error_naming_it(
    pytester: pytest.Pytester, options: list[str], named: str
) -> None:
    pytester.makepyfile(test_leaky=KEEPS.format(tests=1))
    result = pytester.runpytest(*options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {named}*, got *"])


def test_a_limit_below_the_ranks_start_fails_the_distributed_tests_alone(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_mixed=KEEPS.format(tests=3)
        + """
def test_on_the_controller():
    assert KEPT == []
"""
    )
    result = pytester.runpytest("-p", "no:randomly", "--dist-max-rank-memory=100MiB")
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(
        [
            "usage error: --dist-max-rank-memory (or ini dist_max_rank_memory): "
            "max_rank_memory 100.0 MiB (104857600 bytes) is below what this world's ranks "
            "hold as they start (rank 0 starts with * MiB, rank 1 starts with * MiB)*"
        ]
    )


def test_with_dist_leaks_error_the_test_that_names_the_growth_fails_unconfirmed(
    pytester: pytest.Pytester,
) -> None:
    # Fresh processes never ran the earlier tests, so they cannot judge memory that grew
    # over them: the leak stands as the failure, with no run on fresh processes.
    pytester.makepyfile(test_leaky=KEEPS.format(tests=60))
    result = pytester.runpytest("-p", "no:randomly", "-o", "dist_leaks=error")
    result.assert_outcomes(passed=59, failed=1)
    result.stdout.fnmatch_lines(
        [
            "RankLeak: test test_leaky.py::test_keeps[[]*[]] left behind on rank*: resident "
            "memory grew by * MiB over its last * calls and stayed after a garbage collection*"
        ]
    )
    assert "fresh processes" not in result.stdout.str()
    assert "OrderDependenceWarning" not in result.stdout.str()
