"""``--dist-mptc``: torch's ``MultiProcessTestCase`` classes, unchanged, on reused ranks.

Each inner project here is a small unittest suite written the way torch's own distributed
tests are (``MultiProcessTestCase``, ``setUp`` that spawns, ``self.rank`` /
``self.file_name``, ``TEST_SKIPS`` exit codes, ``instantiate_parametrized_tests``), run with
real Gloo process groups. Outcomes must be the class's own verdict, as in a native run; one
test runs a suite both ways and compares the skip reasons (the native run spawns fresh
interpreters for every test, so it runs the skipped test alone).
"""

from __future__ import annotations

import pytest
from plugin_testutil import TWO_RANKS_CLASS, alive, read_pids, reports

pytestmark = pytest.mark.usefixtures("torch_test_modules", "environment_restored")


HEADER = (
    """
import os
import signal
import sys
import time
import unittest

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import (
    TEST_SKIPS,
    TIMEOUT_OVERRIDE,
    MultiProcessTestCase,
    skip_if_lt_x_gpu,
)
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize

PIDS = {pids_dir!r}


def record(name, rank):
    with open(os.path.join(PIDS, f"{{name}}-{{rank}}"), "w") as f:
        f.write(str(os.getpid()))


"""
    + TWO_RANKS_CLASS
)


def _suite(pytester: pytest.Pytester, pids_dir: str, body: str, name: str = "test_suite") -> None:
    pytester.makepyfile(**{name: HEADER.format(pids_dir=pids_dir) + body})


def _failure(result: pytest.RunResult, test: str) -> str:
    """The report of the failed test ``test`` (a method name), as pytest prints it."""
    found = {name.rsplit("::", 1)[-1]: report for name, report in reports(result).items()}
    return str(found[test].longrepr)


def _gpu_skip(n: int) -> str:
    """How torch's ``skip_if_lt_x_gpu(n)`` skips on a machine with fewer than ``n`` GPUs.

    torch 2.15 renamed the keys of ``TEST_SKIPS`` (``multi-gpu-N`` to ``multi-device-N``,
    "CUDA devices" to "accelerator devices"): the message is found by either name."""
    from torch.testing._internal.common_distributed import TEST_SKIPS

    names = (f"multi-gpu-{n}", f"multi-device-{n}")
    return next(skip.message for name, skip in TEST_SKIPS.items() if name in names)


def _skip_reasons(result: pytest.RunResult) -> list[str]:
    """The reasons of the ``-rs`` summary, without their locations (a skip raised in the
    controller by the class's check is located at the check in either run)."""
    return sorted(
        line.split(": ", 1)[1]
        for line in result.outlines
        if line.startswith("SKIPPED [") and ": " in line
    )


def test_counts_and_skip_reasons_match_a_native_run(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    _suite(
        pytester,
        pids_dir,
        """
class TestThree(TwoRanks):
    def test_all_reduce(self):
        self.init_gloo()
        t = torch.ones(2) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t.tolist(), [3.0, 3.0])

    def test_fails_on_rank_1(self):
        self.init_gloo()
        dist.barrier()
        if self.rank == 1:
            raise ValueError("boom on rank one")

    @skip_if_lt_x_gpu(8)
    def test_needs_gpus(self):
        pass
""",
    )
    # Natively, only the skip: its reason is what the comparison is about (the native run
    # spawns fresh interpreters for every test; the other two outcomes are their bodies').
    native = pytester.runpytest("-rs", "-p", "no:randomly", "-k", "test_needs_gpus")
    native.assert_outcomes(skipped=1)
    # dist_confirm=off: the failure on the reused ranks is reported as it is (its run again
    # on fresh processes is test_plugin_confirm.py's subject).
    reused = pytester.runpytest(
        "-rs", "-p", "no:randomly", "--dist-mptc", "-o", "dist_confirm=off"
    )  # fmt: skip
    reused.assert_outcomes(passed=1, failed=1, skipped=1)
    assert _skip_reasons(reused) == _skip_reasons(native) == [_gpu_skip(8)]
    # The harness's report: which rank failed, its traceback first.
    reused.stdout.fnmatch_lines(
        ["*RankError: rank 1 raised ValueError: boom on rank one*", "*- rank 1 -*"]
    )


def test_tests_share_ranks_with_native_attributes(pytester: pytest.Pytester, pids_dir: str) -> None:
    _suite(
        pytester,
        pids_dir,
        """
class TestShared(TwoRanks):
    def setUp(self):
        record(f"setup-{self._testMethodName}", "c")  # setUp runs in the controller
        super().setUp()

    def tearDown(self):
        record(f"teardown-{self._testMethodName}", "c")
        super().tearDown()

    def _check(self, name):
        assert self.rank in (0, 1) and self.world_size == 2
        assert os.path.exists(self.file_name), self.file_name
        # A fresh instance per test: nothing of an earlier test's instance is here.
        assert not hasattr(self, "mark"), "instance state leaked from an earlier test"
        self.mark = name
        record(name, self.rank)
        if self.rank == 0:
            record(f"{name}-file-" + os.path.basename(self.file_name), self.rank)
        self.init_gloo()
        t = torch.tensor([float(self.rank)])
        dist.all_reduce(t)
        assert t.item() == 1.0

    def test_a(self):
        self._check("a")

    def test_b(self):
        self._check("b")

    def test_c(self):
        self._check("c")


class TestThreeRanks(TwoRanks):
    @property
    def world_size(self):
        return 3

    def test_d(self):
        record("d", self.rank)
        self.init_gloo()
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 3.0
""",
    )
    pytester.makeini("[pytest]\ndist_mptc = true\n")
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=4)
    pids = read_pids(pids_dir, "")
    a, b, c = ([pids[f"{name}-{rank}"] for rank in (0, 1)] for name in "abc")
    d = [pids[f"d-{rank}"] for rank in (0, 1, 2)]
    assert a == b == c, "the tests of one world size share their ranks"
    assert not set(d) & set(a), "another world size, another world"
    assert pids["setup-test_a-c"] == pids["teardown-test_c-c"] not in a, "setUp, tearDown in pytest"
    files = {name.split("-file-")[1] for name in pids if "-file-" in name}
    assert len(files) == 3, "every test gets its own file_name, as its setUp made it"
    for pid in a + d:
        assert not alive(pid), "no rank outlives the session"


def test_a_failure_reports_the_failing_rank_and_the_next_test_gets_fresh_ranks(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    _suite(
        pytester,
        pids_dir,
        """
class TestFailure(TwoRanks):
    def test_1_before(self):
        record("before", self.rank)

    def test_2_fails(self):
        record("fails", self.rank)
        self.init_gloo()
        dist.barrier()
        if self.rank == 1:
            self.assertEqual(self.rank, 0, "rank 1 disagrees")

    def test_3_after(self):
        record("after", self.rank)
        self.init_gloo()
        dist.barrier()
""",
    )
    # dist_confirm=off: the failing test runs on the reused ranks only (a confirmation on
    # fresh processes would record its pids again; see test_plugin_confirm.py).
    result = pytester.runpytest("-p", "no:randomly", "--dist-mptc", "-o", "dist_confirm=off")
    result.assert_outcomes(passed=2, failed=1)
    failure = _failure(result, "test_2_fails")
    assert failure.startswith("RankError: rank 1 raised AssertionError"), failure
    assert "- rank 1 -" in failure, failure
    assert "- rank 0" not in failure, failure
    assert 'self.assertEqual(self.rank, 0, "rank 1 disagrees")' in failure, failure
    assert "rank 1 disagrees" in failure
    # The traceback starts at the test, not in torch's process runner.
    assert "run_test" not in failure, failure
    pids = read_pids(pids_dir, "")
    assert pids["before-0"] == pids["fails-0"], "the failing test ran on the reused ranks"
    assert not {pids["after-0"], pids["after-1"]} & {pids["fails-0"], pids["fails-1"]}, (
        "a failed test's ranks are replaced"
    )


def test_skips_through_exit_codes_keep_the_class_reasons(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    _suite(
        pytester,
        pids_dir,
        """
class TestSkips(TwoRanks):
    def test_1_first(self):
        record("first", self.rank)

    @skip_if_lt_x_gpu(8)
    def test_2_gpus(self):
        pass

    def test_3_exit_code(self):
        sys.exit(TEST_SKIPS["small_worldsize"].exit_code)

    def test_4_skip_inside_rank(self):
        self.skipTest("not on this rank")

    @unittest.skip("decided in the controller")
    def test_5_decorated(self):
        pass

    def test_6_after(self):
        record("after", self.rank)
""",
    )
    result = pytester.runpytest("-rs", "-p", "no:randomly", "--dist-mptc")
    result.assert_outcomes(passed=2, skipped=4)
    assert _skip_reasons(result) == sorted(
        [
            _gpu_skip(8),
            "Skipped due to small world size.",
            "Test skipped at subprocess level, look at subprocess log for skip reason",
            "decided in the controller",
        ]
    )
    pids = read_pids(pids_dir, "")
    assert pids["first-0"] == pids["after-0"], "a skip exit keeps the ranks"


def test_a_hang_times_out_at_the_class_timeout_with_every_rank_stack(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    # The class's 5 s start when the ranks get the test. test_2_hangs runs on the ranks
    # test_1_first ran on (and on no fresh ones: dist_confirm=off below), which imported
    # the test module and know torch's default thread count for the test's environment
    # by then (a rank whose forkserver did not preload the --dist-mptc rank module learns
    # it from a fresh interpreter: seconds on a loaded machine). The 5 s hold the body.
    _suite(
        pytester,
        pids_dir,
        """
TIMEOUT_OVERRIDE["test_2_hangs"] = 5  # the class's own per-test limit

class TestHang(TwoRanks):
    def test_1_first(self):
        pass

    def test_2_hangs(self):
        if self.rank == 1:
            time.sleep(3600)

    def test_3_after(self):
        record("after", self.rank)
""",
    )
    # dist_confirm=off: the report is the reused ranks' run's. A confirmation on fresh
    # processes would wait out the class's 5 s a second time, on ranks that have yet to
    # import the module (test_plugin_confirm.py checks confirmations under --dist-mptc,
    # test_plugin_interrupts.py the confirmation of a hang).
    result = pytester.runpytest("-p", "no:randomly", "--dist-mptc", "-o", "dist_confirm=off")
    result.assert_outcomes(passed=2, failed=1)
    failure = _failure(result, "test_2_hangs")
    assert failure.startswith("WorldTimeout: the run did not finish within 5 s"), failure
    assert "time.sleep(3600)" in failure, failure


def test_a_crashing_rank_fails_the_test(pytester: pytest.Pytester, pids_dir: str) -> None:
    _suite(
        pytester,
        pids_dir,
        """
class TestCrash(TwoRanks):
    def test_1_exits(self):
        if self.rank == 0:
            os._exit(3)
        self.init_gloo()
        dist.barrier()

    def test_2_killed(self):
        if self.rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        self.init_gloo()
        dist.barrier()

    def test_3_after(self):
        self.init_gloo()
        dist.barrier()
""",
    )
    result = pytester.runpytest("-p", "no:randomly", "--dist-mptc")
    result.assert_outcomes(passed=1, failed=2)
    exited = _failure(result, "test_1_exits")
    assert exited.startswith("RankCrash: rank 0 exited with code 3"), exited
    killed = _failure(result, "test_2_killed")
    assert killed.startswith("RankCrash: rank 0 was killed by SIGKILL"), killed


def test_the_class_check_decides_an_exit_it_expects(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    # As torch's DistributedTest does for a test expected to crash a process: the class's
    # own check skips the exit-code comparison, so the test passes, natively and here.
    _suite(
        pytester,
        pids_dir,
        """
class TestExpectedExit(TwoRanks):
    def setUp(self):
        super().setUp()
        self.skip_return_code_checks = [self.test_1_expected_exit.__wrapped__]

    def test_1_expected_exit(self):
        if self.rank == 0:
            os._exit(3)

    def test_2_unexpected_exit(self):
        if self.rank == 0:
            os._exit(3)
""",
    )
    result = pytester.runpytest("-p", "no:randomly", "--dist-mptc", "-W", "default")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*test_1_expected_exit passed by its class's own check although rank 0 exited with*"]
    )


def test_tests_that_make_their_own_group_from_the_environment(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    # As torch's DistributedTest does: setUp makes a fresh temp dir and INIT_METHOD in the
    # environment for every test, and the processes rendezvous there.
    _suite(
        pytester,
        pids_dir,
        """
from torch.testing._internal.common_distributed import (
    DistributedTestBase,
    cleanup_temp_dir,
    initialize_temp_directories,
)


class TestOwnInit(TwoRanks):
    def setUp(self):
        initialize_temp_directories()
        super().setUp()

    def tearDown(self):
        cleanup_temp_dir()
        super().tearDown()

    def _round(self, name):
        record(name, self.rank)
        dist.init_process_group(
            "gloo",
            init_method=os.environ["INIT_METHOD"],
            rank=self.rank,
            world_size=self.world_size,
        )
        t = torch.tensor([1.0])
        dist.all_reduce(t)
        assert t.item() == 2.0
        dist.destroy_process_group()

    def test_a(self):
        self._round("a")

    def test_b(self):
        self._round("b")

    def test_c(self):
        self._round("c")


class TestEnvInit(TwoRanks):
    # The port chosen in pytest's process is the one the processes see, as natively.
    def setUp(self):
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = os.environ["CHOSEN_PORT"] = str(sock.getsockname()[1])
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        super().setUp()

    def test_env_init(self):
        assert os.environ["MASTER_PORT"] == os.environ["CHOSEN_PORT"]
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size)
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2.0


class TestBase(DistributedTestBase):
    @property
    def world_size(self):
        return 2

    def test_create_pg(self):
        pg = self.create_pg("cpu")
        t = torch.ones(1)
        dist.all_reduce(t, group=pg)
        assert t.item() == 2.0
""",
    )
    result = pytester.runpytest("-p", "no:randomly", "--dist-mptc")
    result.assert_outcomes(passed=5)
    pids = read_pids(pids_dir, "")
    assert pids["a-0"] == pids["b-0"] == pids["c-0"]


def test_parametrized_tests_run_each_instantiation(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    _suite(
        pytester,
        pids_dir,
        """
class TestParam(TwoRanks):
    @parametrize("n", [1, 2, 3])
    def test_scaled(self, n):
        record(f"n{n}", self.rank)
        self.init_gloo()
        t = torch.full((1,), float(n))
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0 * n)
        self.assertNotEqual(n, 3)


instantiate_parametrized_tests(TestParam)
""",
    )
    # dist_confirm=off: the failing test runs on the reused ranks only (its confirmation on
    # fresh processes would record its pids again).
    result = pytester.runpytest("-p", "no:randomly", "--dist-mptc", "-v", "-o", "dist_confirm=off")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*TestParam::test_scaled_n_1 PASSED*",
            "*TestParam::test_scaled_n_2 PASSED*",
            "*TestParam::test_scaled_n_3 FAILED*",
        ]
    )
    pids = read_pids(pids_dir, "")
    assert pids["n1-0"] == pids["n2-0"] == pids["n3-0"]
