"""How a marked test's body reaches its ranks: by reference, with its fixtures, parameters
and class; what a rank sees; invalid markers and unavailable backends."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from plugin_testutil import read_pids, reports


def test_bodies_run_on_every_rank_by_reference(pytester: pytest.Pytester, pids_dir: str) -> None:
    # Module-level code runs where the module is imported; conftest code and collection
    # hooks only where pytest collects. Ranks import the test module, never collect.
    pytester.makeconftest(
        f"""
        import os
        import pytest

        PIDS = {pids_dir!r}
        open(os.path.join(PIDS, f"conftest-{{os.getpid()}}"), "w").write(str(os.getpid()))

        def pytest_collection_modifyitems(items):
            with open(os.path.join(PIDS, f"collect-{{os.getpid()}}"), "w") as f:
                f.write(str(os.getpid()))

        @pytest.fixture
        def controller_pid():
            return os.getpid()
        """
    )
    pytester.makepyfile(
        f"""
        import os
        import pytest
        import torch
        import torch.distributed as dist

        PIDS = {pids_dir!r}
        open(os.path.join(PIDS, f"module-{{os.getpid()}}"), "w").write(str(os.getpid()))

        @pytest.mark.distributed(world_size=2)
        def test_body(rank, controller_pid):
            assert os.getpid() != controller_pid
            assert dist.is_initialized() and dist.get_world_size() == 2
            t = torch.tensor([rank + 1.0])
            dist.all_reduce(t)
            assert t.item() == 3.0
            with open(os.path.join(PIDS, f"body-{{rank}}"), "w") as f:
                f.write(str(os.getpid()))
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    me = os.getpid()
    assert list(read_pids(pids_dir, "conftest-").values()) == [me]
    assert list(read_pids(pids_dir, "collect-").values()) == [me]
    bodies = read_pids(pids_dir, "body-")
    assert sorted(bodies) == ["body-0", "body-1"]
    assert me not in bodies.values()
    assert len(set(bodies.values())) == 2
    modules = set(read_pids(pids_dir, "module-").values())
    assert modules == {me, *bodies.values()}


def test_rank_side_fixture_values(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os
        import pytest
        import torch
        import torch.distributed as dist

        import fhelium.distributed

        @pytest.mark.distributed(world_size=3)
        def test_values(rank, world_size, local_rank, local_device):
            assert type(rank) is int and type(world_size) is int and type(local_rank) is int
            assert rank == dist.get_rank() == int(os.environ["RANK"])
            assert world_size == 3 == dist.get_world_size() == int(os.environ["WORLD_SIZE"])
            assert local_rank == rank == int(os.environ["LOCAL_RANK"])
            assert local_device == fhelium.distributed.local_device()
            if not torch.cuda.is_available():
                assert local_device == torch.device("cpu")
            assert os.environ["MASTER_ADDR"] == "127.0.0.1"

        @pytest.mark.distributed(world_size=1)
        def test_world_of_one(rank, world_size, local_rank):
            assert (rank, world_size, local_rank) == (0, 1, 0)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)


def test_list_values_parametrize_and_combine_with_parametrize(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=[1, 2], backend=["gloo"])
        @pytest.mark.parametrize("k", [10, 20])
        def test_both(rank, world_size, k):
            assert dist.get_world_size() == world_size
            assert dist.get_backend() == "gloo"
            assert k in (10, 20)

        @pytest.mark.distributed(world_size=[2, 3])
        def test_sizes(world_size):
            assert dist.get_world_size() == world_size

        @pytest.mark.distributed([1])
        def test_positional_list(world_size):
            assert world_size == 1
        """
    )
    collected = pytester.runpytest("--collect-only", "-q")
    collected.stdout.fnmatch_lines(
        [
            "*::test_both[[]ws1-gloo-10[]]",
            "*::test_both[[]ws1-gloo-20[]]",
            "*::test_both[[]ws2-gloo-10[]]",
            "*::test_both[[]ws2-gloo-20[]]",
            "*::test_sizes[[]ws2[]]",
            "*::test_sizes[[]ws3[]]",
            "*::test_positional_list[[]ws1[]]",
        ]
    )
    result = pytester.runpytest("-k", "ws2 or ws3 or positional")
    result.assert_outcomes(passed=5, deselected=2)


def test_test_classes_are_instantiated_in_each_rank(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    pytester.makepyfile(
        f"""
        import os
        import pytest
        import torch.distributed as dist

        class TestThing:
            kind = "class attribute"

            def setup_method(self, method):
                self.setup_for = method.__name__
                self.controller_pid = os.getpid()

            @pytest.mark.distributed(world_size=2)
            def test_method(self, rank):
                assert type(self).__name__ == "TestThing" and self.kind == "class attribute"
                assert self.setup_for == "test_method"
                assert self.controller_pid != os.getpid()
                path = os.path.join({pids_dir!r}, f"instance-{{rank}}")
                open(path, "w").write(str(os.getpid()))

            @pytest.mark.distributed(world_size=[1, 2])
            @pytest.mark.parametrize("x", ["a", "b"])
            def test_parametrized_method(self, world_size, x):
                assert self.setup_for == "test_parametrized_method"
                assert dist.get_world_size() == world_size

        class TestOuter:
            class TestInner:
                @pytest.mark.distributed(world_size=2)
                def test_nested(self, rank):
                    assert type(self).__qualname__ == "TestOuter.TestInner"
        """
    )
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*::TestOuter::TestInner::test_nested PASSED*"])
    instances = read_pids(pids_dir, "instance-")
    assert sorted(instances) == ["instance-0", "instance-1"]
    assert os.getpid() not in instances.values()


def test_controller_fixtures_tmp_path_and_teardown_order(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    pytester.makeconftest(
        f"""
        import os
        import pytest

        @pytest.fixture(scope="session")
        def settings():
            return {{"scale": 3, "controller": os.getpid()}}

        @pytest.fixture
        def shared(tmp_path, settings):
            yield {{"dir": tmp_path, "scale": settings["scale"]}}
            # Teardown: runs in the controller once every rank is done.
            names = sorted(p.name for p in tmp_path.iterdir())
            with open(os.path.join({pids_dir!r}, "teardown"), "w") as f:
                f.write(f"{{os.getpid()}} " + ",".join(names))
        """
    )
    pytester.makepyfile(
        """
        import os
        import time
        import pytest
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=2)
        def test_shared_dir(rank, tmp_path, shared, settings):
            assert shared["dir"] == tmp_path and tmp_path.is_dir()
            assert settings["controller"] != os.getpid()
            if rank == 1:
                time.sleep(0.3)  # the teardown must still wait for this rank
            (tmp_path / f"rank{rank}.txt").write_text(str(rank * shared["scale"]))
            dist.barrier()
            seen = sorted(p.name for p in tmp_path.iterdir())
            assert seen == ["rank0.txt", "rank1.txt"], "one directory for all ranks"
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    with open(os.path.join(pids_dir, "teardown")) as handle:
        pid, names = handle.read().split(" ")
    assert int(pid) == os.getpid()
    assert names == "rank0.txt,rank1.txt"


def test_unpicklable_fixture_fails_that_test_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import threading
        import pytest

        @pytest.fixture
        def lock():
            return threading.Lock()

        @pytest.fixture
        def fine():
            return {"a": 1}

        @pytest.mark.distributed(world_size=2)
        def test_needs_lock(rank, fine, lock):
            pass

        class TestState:
            def setup_method(self):
                self.handle = threading.Lock()

            @pytest.mark.distributed(world_size=2)
            def test_unpicklable_attribute(self, rank):
                pass

        @pytest.mark.distributed(world_size=2)
        def test_after(rank, fine):
            assert fine == {"a": 1}

        def test_plain(lock):
            assert lock.acquire()
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_needs_lock _*",
            "fixture 'lock' cannot be sent to the ranks: its value <unlocked _thread.lock*"
            "does not pickle (TypeError: *); declare it with @harness.fixture instead of "
            "@pytest.fixture, so that each rank builds its own value, or make its value "
            "picklable",
            "*_ TestState.test_unpicklable_attribute _*",
            "attribute 'handle' of the test class instance cannot be sent to the ranks*; "
            "build it in the test, or in a @harness.fixture (each rank builds its own), or "
            "make it picklable",
        ]
    )
    text = result.stdout.str()
    assert "fixture 'fine'" not in text
    # One clear message each: no chained traceback of the pickling error before it.
    assert "During handling of the above exception" not in text
    assert "Traceback" not in text


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        pytest.param("world_size=0", "world_size must be >= 1, got 0", id="ws0"),
        pytest.param("world_size=-2", "world_size must be >= 1, got -2", id="ws-negative"),
        pytest.param("world_size='two'", "world_size must be an int >= 1, not 'two'", id="ws-str"),
        pytest.param(
            "world_size=2, backend='nope'", "unknown backend 'nope'; valid: *", id="backend"
        ),
        pytest.param(
            "world_size=2, timeout=-1",
            "timeout must be a positive number of seconds*got -1",
            id="timeout",
        ),
        pytest.param(
            "world_size=2, workers=3",
            "unknown argument(s) 'workers'; valid: world_size, backend, timeout, isolate, "
            "init, check_collectives, faults, gpus_per_rank, ranks_per_gpu, restarts, verify, "
            "shadow, schedules, schedule_seed, schedule_delay",
            id="unknown-argument",
        ),
        pytest.param(
            "wrold_size=2",
            "unknown argument(s) 'wrold_size' (did you mean 'world_size'?); valid: *",
            id="typo",
        ),
        pytest.param(
            "world_size=[]",
            "world_size must be an int >= 1 or a non-empty list of them, not []",
            id="ws-empty-list",
        ),
        pytest.param("world_size=2, init='no'", "init must be True or False, not 'no'", id="init"),
        pytest.param(
            "2, 3",
            "world_size is the only positional argument, got 2: (2, 3)",
            id="two-positionals",
        ),
    ],
)
def test_invalid_marker_fails_that_test_naming_the_value(
    pytester: pytest.Pytester, marker: str, message: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        def test_before():
            pass

        @pytest.mark.distributed({marker})
        def test_invalid(rank):
            pass

        @pytest.mark.distributed(world_size=2)
        def test_after(rank):
            pass
        """
    )
    result = pytester.runpytest("-rf")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([f"invalid @pytest.mark.distributed: {message}"])
    result.stdout.fnmatch_lines(["FAILED *::test_invalid*"])


def test_invalid_value_in_a_list_fails_only_that_parameter(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distributed(world_size=[0, 2], backend=["gloo", "nope"])
        def test_list(world_size):
            pass
        """
    )
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(["*::test_list[[]ws2-gloo[]] PASSED*"])
    text = result.stdout.str()
    assert "world_size must be >= 1, got 0" in text
    assert "unknown backend 'nope'" in text


def test_nccl_without_enough_gpus_is_a_skip(pytester: pytest.Pytester) -> None:
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.distributed(world_size={found + 1}, backend="nccl")
        def test_nccl(rank):
            pass

        @pytest.mark.distributed(world_size=2, backend="NCCL")
        @pytest.mark.parametrize("x", [1])
        def test_nccl_upper_case(rank, x):
            pass
        """
    )
    result = pytester.runpytest("-rs")
    if found >= 2:
        result.assert_outcomes(passed=1, skipped=1)
    else:
        result.assert_outcomes(skipped=2)
        result.stdout.fnmatch_lines(
            [
                "SKIPPED [[]1[]] test_nccl_without_enough_gpus_is_a_skip.py:7: "
                f"needs 2 GPUs (2 x 1), this run has {found}"
            ]
        )
    # An NCCL rank leases one GPU unless its marker says otherwise.
    needed = found + 1
    result.stdout.fnmatch_lines(
        [
            f"SKIPPED [[]1[]] test_nccl_without_enough_gpus_is_a_skip.py:3: "
            f"needs {needed} GPU{'s' if needed != 1 else ''} ({needed} x 1), this run has {found}"
        ]
    )


def test_backend_torch_lacks_is_a_skip(pytester: pytest.Pytester) -> None:
    missing = [name for name in ("mpi", "ucc") if not dist.is_backend_available(name)]
    if not missing:
        pytest.skip("this torch build has every backend the test could ask for")
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.distributed(world_size=2, backend={missing[0]!r})
        def test_missing(rank):
            pass
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            f"SKIPPED [[]1[]] test_backend_torch_lacks_is_a_skip.py:3: backend {missing[0]!r} "
            f"is not available in this build of torch {torch.__version__}"
        ]
    )


def test_dist_backend_option_overrides_auto_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=2)
        def test_auto(rank):
            assert dist.get_backend() == "nccl"

        @pytest.mark.distributed(world_size=2, backend="gloo")
        def test_explicit_gloo(rank):
            assert dist.get_backend() == "gloo"
        """
    )
    result = pytester.runpytest("--dist-backend", "gloo", "-rs")
    result.assert_outcomes(passed=1, failed=1)  # test_auto ran on gloo
    reps = reports(result)
    assert reps["test_auto"].failed
    assert reps["test_explicit_gloo"].passed
    if torch.cuda.device_count() < 2:
        result = pytester.runpytest("--dist-backend", "nccl", "-rs")
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines(["SKIPPED *: needs 2 GPUs (2 x 1), this run has *"])


def test_a_users_own_rank_or_world_size_wins(pytester: pytest.Pytester) -> None:
    # pytest's overriding rules decide; the plugin never swaps its value in for the user's.
    pytester.makepyfile(
        """
        import pytest
        import torch.distributed as dist

        @pytest.fixture
        def world_size():
            return 42

        @pytest.mark.distributed(world_size=2)
        @pytest.mark.parametrize("rank", [5, 7])
        def test_own_values(rank, world_size, local_rank):
            assert rank in (5, 7)
            assert world_size == 42
            assert local_rank == dist.get_rank()  # still the plugin's: not overridden
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)
