"""Worlds are reused across tests, rebuilt after any failure, and fresh when isolated; a bad
test never changes the next test's outcome, and no rank outlives the session."""

from __future__ import annotations

import pytest
from plugin_testutil import alive, read_pids

# Each test writes "<name>-<rank>" = its pid to PIDS, so the outer test can compare worlds.
HEADER = """
import os
import pytest
import torch
import torch.distributed as dist

PIDS = {pids_dir!r}

def record(name):
    rank = dist.get_rank()
    with open(os.path.join(PIDS, f"{{name}}-{{rank}}"), "w") as f:
        f.write(str(os.getpid()))
"""


def world_pids(pids: dict[str, int], name: str) -> list[int]:
    """The pids test ``name`` recorded, by rank."""
    found = {key: pid for key, pid in pids.items() if key.rsplit("-", 1)[0] == name}
    return [found[key] for key in sorted(found, key=lambda key: int(key.rsplit("-", 1)[1]))]


def test_worlds_are_reused_and_rebuilt_after_failures(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    pytester.makepyfile(
        HEADER.format(pids_dir=pids_dir)
        + """
@pytest.mark.distributed(world_size=2)
def test_a(rank):
    record("a")

@pytest.mark.distributed(world_size=3)
def test_b(rank):
    record("b")

@pytest.mark.distributed(world_size=2)
def test_c(rank):
    record("c")

@pytest.mark.distributed(world_size=2, isolate=True)
def test_isolated(rank):
    record("isolated")

@pytest.mark.distributed(world_size=2)
def test_d(rank):
    record("d")

@pytest.mark.distributed(world_size=2)
def test_fails(rank):
    record("fails")
    assert rank == 0

@pytest.mark.distributed(world_size=2)
def test_e(rank):
    record("e")

@pytest.mark.distributed(world_size=2)
def test_f(rank):
    record("f")
"""
    )
    # dist_confirm=off: the failing test runs on the reused ranks only (its confirmation on
    # fresh processes would record its pids again; see test_plugin_confirm.py).
    result = pytester.runpytest("-o", "dist_confirm=off")
    result.assert_outcomes(passed=7, failed=1)
    pids = read_pids(pids_dir, "")
    a, b, c, isolated, d, fails, e, f = (
        world_pids(pids, name) for name in ("a", "b", "c", "isolated", "d", "fails", "e", "f")
    )
    assert len(a) == 2
    assert len(b) == 3
    assert a == c == d == fails, "one world per size, reused"
    assert not set(b) & set(a)
    assert not set(isolated) & set(a), "isolate=True gets fresh processes"
    assert not set(e) & set(a), "the world is rebuilt after a failure"
    assert e == f, "...and reused again afterwards"
    for pid in a + b + isolated + e:
        assert not alive(pid), "no rank outlives the session"


def test_dist_isolate_option_gives_every_test_fresh_processes(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    pytester.makepyfile(
        HEADER.format(pids_dir=pids_dir)
        + """
@pytest.mark.distributed(world_size=2)
def test_a(rank):
    record("a")

@pytest.mark.distributed(world_size=2)
def test_b(rank):
    record("b")

@pytest.mark.distributed(world_size=2, isolate=False)
def test_c(rank):
    record("c")
"""
    )
    result = pytester.runpytest("--dist-isolate")
    result.assert_outcomes(passed=3)
    pids = read_pids(pids_dir, "")
    a, b, c = (world_pids(pids, name) for name in "abc")
    assert len(set(a + b + c)) == 6


def test_a_bad_test_never_changes_the_next_outcome(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os
        import signal
        import time
        import pytest
        import torch
        import torch.distributed as dist

        SENTINEL = "HARNESS_PLUGIN_TEST_LEAK"

        def check_clean_world():
            assert dist.is_initialized() and dist.get_world_size() == 2
            assert SENTINEL not in os.environ
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == 2

        @pytest.mark.distributed(world_size=2)
        def test_changes_environment(rank, tmp_path):
            os.environ[SENTINEL] = "1"
            os.chdir(tmp_path)
            group = dist.new_group([0, 1])  # destroyed before the next call
            dist.all_reduce(torch.ones(1), group=group)

        @pytest.mark.distributed(world_size=2)
        def test_after_environment(rank, tmp_path):
            check_clean_world()
            assert os.getcwd() != str(tmp_path.parent / "test_changes_environment0")

        @pytest.mark.distributed(world_size=2)
        def test_fails(rank):
            os.environ[SENTINEL] = "1"
            raise RuntimeError(f"boom {rank}")

        @pytest.mark.distributed(world_size=2)
        def test_after_failure(rank):
            check_clean_world()

        @pytest.mark.distributed(world_size=2, timeout=1)
        def test_hangs(rank):
            if rank == 0:
                time.sleep(3600)
            dist.barrier()

        @pytest.mark.distributed(world_size=2)
        def test_after_hang(rank):
            check_clean_world()

        @pytest.mark.distributed(world_size=2)
        def test_crashes(rank):
            if rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.barrier()

        @pytest.mark.distributed(world_size=2)
        def test_after_crash(rank):
            check_clean_world()

        @pytest.mark.distributed(world_size=2)
        def test_destroys_the_group(rank):
            dist.destroy_process_group()

        @pytest.mark.distributed(world_size=2)
        def test_after_destroy(rank):
            check_clean_world()

        @pytest.mark.distributed(world_size=2)
        def test_skips(rank):
            pytest.skip("skipped")

        @pytest.mark.distributed(world_size=2)
        def test_after_skip(rank):
            check_clean_world()
        """
    )
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=8, failed=3, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*::test_changes_environment PASSED*",
            "*::test_after_environment PASSED*",
            "*::test_fails FAILED*",
            "*::test_after_failure PASSED*",
            "*::test_hangs FAILED*",
            "*::test_after_hang PASSED*",
            "*::test_crashes FAILED*",
            "*::test_after_crash PASSED*",
            "*::test_destroys_the_group PASSED*",
            "*::test_after_destroy PASSED*",
            "*::test_skips SKIPPED*",
            "*::test_after_skip PASSED*",
        ]
    )
    result.stdout.fnmatch_lines(["*RankCrash: rank 1 was killed by SIGKILL*"])


def test_groups_made_on_some_ranks_only_do_not_break_the_next_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=2)
        def test_a_subset_group(rank):
            if rank == 0:
                dist.new_group(ranks=[0])  # a bug: every rank must call new_group

        @pytest.mark.distributed(world_size=2, timeout=60)
        def test_b_uses_a_new_group(rank):
            group = dist.new_group(ranks=[0, 1])
            total = torch.ones(1)
            dist.all_reduce(total, group=group)
            assert total.item() == 2
            dist.destroy_process_group(group)
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2, warnings=2)
    result.stdout.fnmatch_lines(
        [
            "*test_a_subset_group*",
            "*RuntimeWarning: the call left the ranks' process-group counters out of step "
            "(rank 0: *, rank 1: *): new_group was called on some ranks only*",
            "*RuntimeWarning: test *test_a_subset_group left behind in a reused rank: rank 0: "
            "process group of ranks [[]0[]] made at *:8 was not destroyed",
        ]
    )


def test_init_false_tests_make_their_own_group_in_a_reused_world(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    pytester.makepyfile(
        f"""
        import os
        import pytest
        import torch
        import torch.distributed as dist
        import fhelium.distributed

        PIDS = {pids_dir!r}

        def record(name, rank):
            with open(os.path.join(PIDS, f"{{name}}-{{rank}}"), "w") as f:
                f.write(str(os.getpid()))

        def check_sum(world_size):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == world_size

        @pytest.mark.distributed(world_size=2, init=False)
        def test_a_init_process_group(rank, world_size, local_rank, local_device):
            assert not dist.is_initialized()
            assert (rank, world_size, local_rank) == (int(os.environ["RANK"]), 2, rank)
            cuda = torch.cuda.is_available()
            assert local_device == (torch.device("cuda", rank) if cuda else torch.device("cpu"))
            dist.init_process_group("gloo")
            assert dist.get_rank() == rank
            check_sum(world_size)
            record("a", rank)

        @pytest.mark.distributed(world_size=2, init=False)
        def test_b_fhelium_init(rank, world_size):
            assert not dist.is_initialized()
            fhelium.distributed.init(backend="gloo")
            dist.new_group()  # left behind, with the default group
            check_sum(world_size)
            record("b", rank)

        @pytest.mark.distributed(world_size=2, init=False)
        def test_c_init_method(rank, world_size):
            assert not dist.is_initialized()
            dist.init_process_group(
                "gloo", init_method=os.environ["INIT_METHOD"], rank=rank, world_size=world_size
            )
            check_sum(world_size)
            record("c", rank)

        @pytest.mark.distributed(world_size=2)
        def test_d_with_the_harness_group(rank, world_size):
            check_sum(world_size)
            record("d", rank)
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=4)
    pids = read_pids(pids_dir, "")
    a, b, c, d = (world_pids(pids, name) for name in "abcd")
    assert len(a) == 2
    assert a == b == c, "one init=False world, reused"
    assert not set(d) & set(a), "worlds with and without a harness group are separate"


def test_a_destroyed_default_group_is_made_again_on_the_same_processes(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    pytester.makepyfile(
        HEADER.format(pids_dir=pids_dir)
        + """
@pytest.mark.distributed(world_size=2)
def test_a_destroys_it(rank):
    record("a")
    dist.destroy_process_group()

@pytest.mark.distributed(world_size=2)
def test_b_after(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size
    record("b")

@pytest.mark.distributed(world_size=2)
def test_c_destroys_it_on_rank_1_only(rank):
    record("c")
    if rank == 1:
        dist.destroy_process_group()

@pytest.mark.distributed(world_size=2)
def test_d_after(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size
    record("d")
"""
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=4, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*test_c_destroys_it_on_rank_1_only*",
            "*RuntimeWarning: the call destroyed the default process group on rank 1 only "
            "(rank 0 kept it)*the world is rebuilt before the next call",
        ]
    )
    pids = read_pids(pids_dir, "")
    a, b, c, d = (world_pids(pids, name) for name in "abcd")
    assert a == b == c, "a fresh default group on the same processes"
    assert not set(d) & set(c), "out of step: the world was rebuilt"
