"""Whether pytest runs under an external launcher is decided once, when the session starts.

torch's own suites have tests that leave ``RANK`` and ``WORLD_SIZE`` in pytest's environment
(``RendezvousEnvTest.test_logging_init``); the tests after them must still run on the
harness's ranks, not in-process as under torchrun, nor natively in fresh processes.
"""

from __future__ import annotations

import pytest
from plugin_testutil import TWO_RANKS_CLASS, read_pids

pytestmark = pytest.mark.usefixtures("torch_test_modules", "environment_restored")

SUITE = (
    """
import os
import unittest

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase

PIDS = {pids_dir!r}


def record(name, rank):
    with open(os.path.join(PIDS, f"{{name}}-{{rank}}"), "w") as f:
        f.write(str(os.getpid()))

"""
    + TWO_RANKS_CLASS
    + """

class TestA(TwoRanks):
    def test_1_before(self):
        record("before", self.rank)
        self.init_gloo()
        dist.all_reduce(torch.ones(1))


class TestB(unittest.TestCase):
    def test_2_leaks(self):
        # As torch's RendezvousEnvTest.test_logging_init leaves them.
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = "1"


class TestC(TwoRanks):
    def test_3_after(self):
        record("after", self.rank)
        self.init_gloo()
        dist.all_reduce(torch.ones(1))


@pytest.mark.distributed(world_size=2)
def test_4_marked(rank):
    record("marked", rank)
    dist.all_reduce(torch.ones(1))
"""
)


def test_a_leaked_rank_and_world_size_put_no_later_test_under_a_launcher(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    pytester.makepyfile(test_suite=SUITE.format(pids_dir=pids_dir))
    result = pytester.runpytest("-p", "no:randomly", "--dist-mptc")
    result.assert_outcomes(passed=4)
    pids = read_pids(pids_dir, "")
    before, after = ([pids[f"{name}-{rank}"] for rank in (0, 1)] for name in ("before", "after"))
    assert after == before, "the MultiProcessTestCase test after the leak ran on the same ranks"
    assert sorted(name for name in pids if name.startswith("marked")) == [
        "marked-0",
        "marked-1",
    ], "the marked test after the leak ran on two ranks"
