"""``--dist-mptc``: a reused rank shows each test the process state a fresh native one would.

torch's own suites trip over state a reused rank kept from an earlier test: a backend an
earlier test registered, the default dtype it set, an RPC agent it started (or shut down),
the harness's own torchrun variables and thread count. Each inner suite here runs a test
that changes such state and then one that expects a fresh process's, as a native run gives
it; every outcome must be the native one.
"""

from __future__ import annotations

import pytest
from plugin_testutil import REGISTRY, TWO_RANKS_CLASS, read_pids

# Every test here drives torch's MultiProcessTestCase through --dist-mptc with real Gloo
# (and TensorPipe) between real processes.


pytestmark = pytest.mark.usefixtures("torch_test_modules", "environment_restored")


HEADER = (
    """
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase

PIDS = {pids_dir!r}


def record(name, rank):
    with open(os.path.join(PIDS, f"{{name}}-{{rank}}"), "w") as f:
        f.write(str(os.getpid()))


"""
    + TWO_RANKS_CLASS
)


def _run(pytester: pytest.Pytester, pids_dir: str, body: str) -> pytest.RunResult:
    pytester.makepyfile(test_suite=HEADER.format(pids_dir=pids_dir) + body)
    # Without a second run on fresh processes: a leak must show as the failure it causes.
    return pytester.runpytest("-p", "no:randomly", "--dist-mptc", "-o", "dist_confirm=off")


def test_a_backend_registered_by_one_test_is_gone_in_the_next(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    # As test_c10d_common.py's test_is_backend_available after tests that register one.
    result = _run(
        pytester,
        pids_dir,
        """
class TestRegistry(TwoRanks):
    def test_1_registers(self):
        record("registers", self.rank)
        dist.Backend.register_backend("fidelitydummy", lambda *args: None, devices=["cpu"])
        assert dist.is_backend_available("fidelitydummy")

    def test_2_fresh(self):
        record("fresh", self.rank)
        assert not dist.is_backend_available("fidelitydummy")
        assert not hasattr(dist.Backend, "FIDELITYDUMMY")
        assert "fidelitydummy" not in dist.Backend.backend_list
        assert "fidelitydummy" not in dist.Backend.backend_type_map
        assert "fidelitydummy" not in dist.Backend.backend_capability
        assert dist.Backend.default_device_backend_map["cpu"] == "gloo"
""",
    )
    result.assert_outcomes(passed=2)
    pids = read_pids(pids_dir, "")
    assert pids["registers-0"] == pids["fresh-0"], "both tests ran on the same reused rank"


def test_torch_settings_a_test_changed_are_put_back(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    result = _run(
        pytester,
        pids_dir,
        """
class TestSettings(TwoRanks):
    def test_1_changes(self):
        record("changes", self.rank)
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        torch.use_deterministic_algorithms(True)

    def test_2_fresh(self):
        record("fresh", self.rank)
        assert torch.get_default_dtype() == torch.float32
        assert torch.ones(1).dtype == torch.float32
        assert torch.is_grad_enabled()
        assert not torch.are_deterministic_algorithms_enabled()
""",
    )
    result.assert_outcomes(passed=2)
    pids = read_pids(pids_dir, "")
    assert pids["changes-0"] == pids["fresh-0"], "both tests ran on the same reused rank"


def test_a_rank_has_the_environment_and_threads_of_a_native_process(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    # A native rank is a spawned child of pytest's process: pytest's environment as the
    # test's setUp left it, no torchrun variables, and torch's default thread count (what a
    # fresh interpreter with that environment has), whatever the harness's ranks use.
    result = _run(
        pytester,
        pids_dir,
        """
def note_fresh_threads():
    # What a fresh interpreter with this environment has (torch caps OMP_NUM_THREADS, say):
    # asked once, in setUp's process, and read back by every rank.
    fresh = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True, text=True, check=True,
    )
    with open(os.path.join(PIDS, "fresh-threads"), "w") as f:
        f.write(fresh.stdout)


def fresh_threads():
    with open(os.path.join(PIDS, "fresh-threads")) as f:
        return int(f.read())


class TestEnvironment(TwoRanks):
    def setUp(self):
        os.environ["FIDELITY_FROM_SETUP"] = "1"
        with open(os.path.join(PIDS, "controller-environ.json"), "w") as f:
            json.dump(dict(os.environ), f)
        if self._testMethodName == "test_threads":
            note_fresh_threads()
        super().setUp()

    def test_environment(self):
        for name in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                     "ROLE_NAME", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE"):
            assert name not in os.environ, name
        assert not [name for name in os.environ if name.startswith("TORCHELASTIC_")]
        with open(os.path.join(PIDS, "controller-environ.json")) as f:
            controller = json.load(f)
        # run_test sets this one itself, in every process.
        mine = {k: v for k, v in os.environ.items() if k != "TORCH_SHOW_CPP_STACKTRACES"}
        controller.pop("TORCH_SHOW_CPP_STACKTRACES", None)
        assert mine == controller

    def test_threads(self):
        assert torch.get_num_threads() == fresh_threads()


class TestThreadsFromEnvironment(TwoRanks):
    def setUp(self):
        os.environ["OMP_NUM_THREADS"] = "1"
        note_fresh_threads()
        super().setUp()

    def test_threads(self):
        assert os.environ["OMP_NUM_THREADS"] == "1"
        assert torch.get_num_threads() == fresh_threads()
""",
    )
    result.assert_outcomes(passed=3)


RPC_SUITE = """
import torch.distributed.rpc as rpc


class TestRpc(TwoRanks):
    def _init(self):
        options = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{self.file_name}")
        rpc.init_rpc(
            f"worker{self.rank}",
            rank=self.rank,
            world_size=self.world_size,
            rpc_backend_options=options,
        )

    def _round(self, name):
        record(name, self.rank)
        self._init()
        peer = f"worker{(self.rank + 1) % self.world_size}"
        assert rpc.rpc_sync(peer, torch.add, args=(torch.ones(1), self.rank)).item() == (
            1 + self.rank
        )
        rref = rpc.remote(peer, torch.mul, args=(torch.ones(1), 2))
        assert rref.to_here().item() == 2.0

    def test_1_rpc(self):
        self._round("rpc1")
        rpc.shutdown()

    def test_2_rpc(self):
        self._round("rpc2")
        rpc.shutdown()

    def test_3_left_running(self):
        self._round("running")
        import torch.distributed.rpc.api as api

        api._ignore_rref_leak = False  # as torch's dist_init does

    def test_4_rpc(self):
        self._round("rpc4")
        rpc.shutdown()

    def test_5_plain(self):
        record("plain5", self.rank)

    def test_6_plain(self):
        record("plain6", self.rank)
"""


def test_rpc_tests_in_a_row_each_start_rpc_as_in_a_fresh_process(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    result = _run(pytester, pids_dir, RPC_SUITE)
    result.assert_outcomes(passed=6)
    pids = read_pids(pids_dir, "")
    assert pids["plain5-0"] == pids["plain6-0"], "tests without RPC keep their ranks"
    # RPC cannot be put back as a fresh process has it: a test that used it is the last
    # one its ranks run.
    ran = [pids[f"{name}-0"] for name in ("rpc1", "rpc2", "running", "rpc4", "plain5")]
    assert len(set(ran)) == len(ran), ran


FLIGHT_RECORDER = """

class TestRecorder(TwoRanks):
    def test_1_collectives(self):
        dist.init_process_group(
            "gloo", init_method=f"file://{self.file_name}", rank=self.rank, world_size=2
        )
        for _ in range(3):
            dist.all_reduce(torch.ones(2))
        dist.destroy_process_group()


class TestRecorderRead(TwoRanks):
    # As torch's own flight recorder tests do: the variable is set for the test's processes.
    def setUp(self):
        os.environ["TORCH_FR_BUFFER_SIZE"] = "10"
        super().setUp()

    def tearDown(self):
        del os.environ["TORCH_FR_BUFFER_SIZE"]
        super().tearDown()

    def test_reads_the_recorder(self):
        store = dist.FileStore(self.file_name, 2)
        pg = dist.ProcessGroupGloo(store, self.rank, 2)
        for _ in range(2):
            pg.allreduce(torch.full((3, 4), float(self.rank))).wait()
        trace = json.loads(
            torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True)
        )
        # A native process's recorder holds this test's collectives and group alone.
        assert len(trace["pg_config"]) == 1, trace["pg_config"]
        assert len(trace["entries"]) == 2, trace["entries"]
"""


def test_a_test_that_reads_the_flight_recorder_gets_fresh_ranks(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # torch's flight recorder keeps every collective a process made, in one process-wide
    # buffer sized at its first use: a reused rank's holds the earlier test's entries.
    pids_dir = str(tmp_path_factory.mktemp("pids"))
    result = _run(pytester, pids_dir, FLIGHT_RECORDER)
    result.assert_outcomes(passed=2)


STALE_STORE = """
import registry


class TestStore(TwoRanks):
    def test_1_registers(self):
        registry.register("relu")

    def test_2_uses_the_store_then_registers(self):
        # setUp leaves the store file empty: a rank finds nothing of an earlier run of this
        # test there (Gloo's ranks would read each other's old addresses from it).
        store = dist.FileStore(self.file_name, 2)
        assert not store.check([f"ran{self.rank}"]), "the store file holds an earlier run's keys"
        store.set(f"ran{self.rank}", "1")
        registry.register("relu")
"""


def test_the_run_on_fresh_ranks_finds_the_store_file_as_setup_left_it(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # test_2 fails on the reused ranks (test_1 registered "relu" there) after it wrote to the
    # store; the confirming run on fresh ranks must pass, as a native run does.
    pids_dir = str(tmp_path_factory.mktemp("pids"))
    pytester.makepyfile(registry=REGISTRY)
    pytester.makepyfile(test_suite=HEADER.format(pids_dir=pids_dir) + STALE_STORE)
    result = pytester.runpytest("-p", "no:randomly", "--dist-mptc")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*OrderDependenceWarning: TestStore::test_2_uses_the_store_then_registers failed after "
            "TestStore::test_1_registers on a reused world and passes on fresh processes*"
        ]
    )
