"""A ``@given`` test's last example goes through the steps after a run as a marked test
does: ``--dist-trace-dir`` writes the minimal example's trace folder, ``--dist-verify``
holds the last example against fresh processes, and an order dependence on an earlier
test is bisected and named with the command that shows it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from plugin_testutil import REGISTRY, reports
from test_plugin_trace_dir import assert_folder

from harness.timeline.folder import folder_name

pytest.importorskip("hypothesis")

HEADER = """
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st

QUICK = settings(database=None, derandomize=True, max_examples=5)
"""

FAILING = """
@QUICK
@given(n=st.integers(0, 10))
@pytest.mark.distributed(world_size=2)
def test_prop(rank, n):
    total = torch.ones(4)
    dist.all_reduce(total)
    # From n = 3 up, after a collective on every rank: a failure, shrunk to n=3.
    assert n < 3, "n too large"
"""


def test_the_minimal_example_gets_a_trace_folder_named_in_the_report(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(test_props=HEADER + FAILING)
    out = tmp_path / "traces"
    result = pytester.runpytest("-p", "no:randomly", f"--dist-trace-dir={out}")
    result.assert_outcomes(failed=1)
    folder = out / folder_name("test_props.py::test_prop")
    assert_folder(folder, 2)
    longrepr = str(reports(result)["test_prop"].longrepr)
    assert "minimal example (2 ranks, " in longrepr, longrepr
    assert "test_prop(n=3)" in longrepr, longrepr
    last = longrepr.splitlines()[-1]
    assert last == f"trace folder: {folder}{os.sep} (timeline.html, trace.json, fr/)"
    assert os.listdir(out) == [folder.name]


# A property that holds only where test_setup_registry ran before it on the same processes.
DEPENDS = """
import registry


@pytest.mark.distributed(world_size=2)
def test_setup_registry(rank):
    registry.register("relu")


@QUICK
@given(n=st.integers(0, 10))
@pytest.mark.distributed(world_size=2)
def test_prop(rank, n):
    assert "relu" in registry._registered
"""


def test_dist_verify_holds_the_last_example_against_fresh_processes(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(registry=REGISTRY, test_props=HEADER + DEPENDS)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2)  # reuse hides it
    result = pytester.runpytest("-p", "no:randomly", "--dist-verify")
    result.assert_outcomes(passed=1, failed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "harness --dist-verify: 1 test also run on fresh processes, 1 differ (each "
            "reported as an order dependence)",
        ]
    )
    failure = str(reports(result)["test_prop"].longrepr)
    assert "assert 'relu' in set()" in failure, failure


def test_an_order_dependence_on_an_earlier_test_is_bisected_and_named(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(registry=REGISTRY, test_props=HEADER + DEPENDS)
    result = pytester.runpytest("-p", "no:randomly", "--dist-verify")
    result.assert_outcomes(passed=1, failed=1, warnings=1)
    # Found among the earlier examples and the earlier test: the test, by name.
    result.stdout.fnmatch_lines(
        [
            "*OrderDependenceWarning: test_prop passed after test_setup_registry on a reused "
            "world and fails on fresh processes (found in *); run: pytest "
            "test_props.py::test_setup_registry test_props.py::test_prop --dist-backend=gloo",
        ]
    )
