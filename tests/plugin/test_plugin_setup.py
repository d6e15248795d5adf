"""How the plugin is registered: entry point, marker, options, ini, fixtures, ``dist_world``."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from plugin_testutil import alive, assert_no_internal_frames


def test_registered_through_the_pytest11_entry_point(pytester: pytest.Pytester) -> None:
    points = importlib.metadata.entry_points(group="pytest11")
    assert any(p.name == "harness" and p.value == "harness.plugin" for p in points)
    config = pytester.parseconfig()
    names = {dist.project_name for _, dist in config.pluginmanager.list_plugin_distinfo()}
    assert "fhelium" in names
    assert config.pluginmanager.hasplugin("harness")


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.distributed(world_size=2, [*], backend='auto', timeout=None, "
            "isolate=False, init=True, check_collectives=True, faults=(), gpus_per_rank=None, "
            "ranks_per_gpu=None, restarts=0, verify=None, shadow=(), schedules=None, "
            "schedule_seed=None, schedule_delay=None): run the test body*"
        ]
    )
    assert result.ret == 0


def test_strict_markers_and_strict_config_are_clean(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\naddopts = --strict-markers --strict-config\ndist_timeout = 60\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distributed(world_size=1)
        def test_one(rank):
            assert rank == 0

        @pytest.mark.distributed
        def test_bare_marker(world_size):
            assert world_size == 2
        """
    )
    result = pytester.runpytest("-W", "error::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(passed=2)


def test_options_and_ini_are_documented(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(
        [
            "distributed tests (fhelium harness):",
            "*--dist-backend={auto,gloo,nccl,ucc,mpi,xccl}*",
            "*--dist-timeout=SECONDS*",
            "*--dist-isolate*",
        ]
    )
    result.stdout.fnmatch_lines(
        ["  dist_timeout (string):", "*default time limit of one distributed test in seconds"]
    )


def test_invalid_option_values_are_usage_errors(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--dist-backend", "bogus")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dist-backend: invalid choice: 'bogus'*"])
    result = pytester.runpytest("--dist-timeout", "soon")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dist-timeout: invalid float value: 'soon'*"])
    for value in ("0", "-1", "nan", "inf"):
        result = pytester.runpytest("--dist-timeout", value)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(
            [f"ERROR: --dist-timeout must be a positive number of seconds, got {float(value)}"]
        )
    pytester.makeini("[pytest]\ndist_timeout = soon\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: ini option dist_timeout must be a positive number of seconds, got 'soon'"]
    )


def test_fixtures_are_listed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--fixtures")
    result.stdout.fnmatch_lines(
        [
            "*fixtures defined from harness.plugin*",
            "dist_world [[]session scope[]] -- *harness/plugin/fixtures.py:*",
            '*dist_world(world_size, backend="auto", init=True)*',
        ]
    )
    for name in ("rank", "world_size", "local_rank", "local_device"):
        result.stdout.fnmatch_lines([f"{name} -- *harness/plugin/fixtures.py*"])


def test_rank_side_fixtures_need_the_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        def test_plain_rank(rank):
            pass

        def test_plain_local_device(local_device):
            pass

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest("-rE")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*fixture 'rank' is only available in tests marked @pytest.mark.distributed "
            "(requested by test_rank_side_fixtures_need_the_marker.py::test_plain_rank)*",
            "*fixture 'local_device' is only available in tests marked*",
        ]
    )
    assert_no_internal_frames(result.stdout.str())


def test_dist_world_is_shared_for_the_session_and_closed_at_its_end(
    pytester: pytest.Pytester,
) -> None:
    worlds: list[object] = []

    class Recorder:
        @pytest.fixture
        def recorder(self) -> list[object]:
            return worlds

    pytester.makepyfile(
        """
        import os

        import harness
        import pytest
        import torch

        def double(x):
            return 2 * x

        def test_first(dist_world, recorder):
            world = dist_world(2, "gloo")
            assert isinstance(world, harness.World)
            assert world.world_size == 2 and world.backend == "gloo"
            assert world.run(double, args=(21,)) == [42, 42]
            assert dist_world(2, backend="gloo") is world
            if not torch.cuda.is_available():
                assert dist_world(2) is world, "'auto' resolves to gloo here"
            recorder.append(world)

        def test_second(dist_world, recorder):
            assert dist_world(2, "gloo") is recorder[0]
            assert os.getpid() not in recorder[0].pids
            one = dist_world(1, "gloo")
            assert one is not recorder[0] and one.world_size == 1
            recorder.append(one)
        """
    )
    result = pytester.runpytest(plugins=[Recorder()])
    result.assert_outcomes(passed=2)
    assert len(worlds) == 2
    for world in worlds:
        assert world.closed  # type: ignore[attr-defined]
        assert not [pid for pid in world.pids if alive(pid)]  # type: ignore[attr-defined]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_dist_world_auto_follows_the_dist_backend_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        def test_auto_is_nccl(dist_world):
            with pytest.raises(RuntimeError, match="needs 2 CUDA devices, found 0"):
                dist_world(2)

        def test_explicit_backend_is_kept(dist_world):
            assert dist_world(2, "gloo").backend == "gloo"
        """
    )
    result = pytester.runpytest("--dist-backend", "nccl")
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize("select", ["all", "deselect"])
def test_the_core_is_imported_after_collection_only_when_a_distributed_test_runs(
    pytester: pytest.Pytester, select: str
) -> None:
    # Imported after collection, not inside the first distributed test (whose duration and
    # pytest-timeout limit would include it); not at all when no distributed test runs.
    pytester.makeconftest(
        """
        import sys

        def pytest_runtest_setup(item):
            loaded = "harness.controller.world" in sys.modules
            print(f"core loaded at setup of {item.name}: {loaded}")
        """
    )
    pytester.makepyfile(
        """
        import pytest

        def test_plain():
            pass

        @pytest.mark.distributed(world_size=1)
        def test_distributed(rank):
            pass
        """
    )
    args = ["-s", "-p", "no:randomly"] + (["-k", "plain"] if select == "deselect" else [])
    result = pytester.runpytest_subprocess(*args)
    if select == "all":
        result.assert_outcomes(passed=2)
        result.stdout.fnmatch_lines(["*core loaded at setup of test_plain: True*"])
    else:
        result.assert_outcomes(passed=1, deselected=1)
        result.stdout.fnmatch_lines(["*core loaded at setup of test_plain: False*"])
