"""``--dist-mptc`` and the desync check: what a ``MultiProcessTestCase`` test's ranks must
agree on, and ``--dist-no-collective-check``.

torch's own ``test_reduce_scatter`` (``test_c10d_gloo.py``) gives each rank an output of
another size, which Gloo allows: it passes natively and must pass here too. A reduce_scatter
whose ranks disagree (another reduce op on one rank) passes natively, since Gloo completes
it with wrong numbers; the desync check fails it, unless ``--dist-no-collective-check`` is
given. Real Gloo between real processes.
"""

from __future__ import annotations

import pytest
from plugin_testutil import TWO_RANKS, reports

pytestmark = pytest.mark.usefixtures("torch_test_modules", "environment_restored")

SUITE = (
    TWO_RANKS
    + """

class TestReduceScatter(TwoRanks):
    def test_uneven(self):
        # As torch's test_reduce_scatter: rank r receives entry r of the list, r + 1 elements.
        self.init_gloo()
        inputs = [torch.ones(i + 1) * (self.rank + 1) for i in range(self.world_size)]
        output = torch.zeros(self.rank + 1)
        dist.reduce_scatter(output, inputs)
        self.assertEqual(output.tolist(), [3.0] * (self.rank + 1))

    def test_ops_differ(self):
        # Completes on Gloo with wrong numbers, which this test does not look at.
        self.init_gloo()
        inputs = [torch.ones(2) * (self.rank + 1) for _ in range(self.world_size)]
        op = dist.ReduceOp.SUM if self.rank == 0 else dist.ReduceOp.MAX
        dist.reduce_scatter(torch.zeros(2), inputs, op=op)
"""
)


def _run(pytester: pytest.Pytester, *options: str) -> pytest.RunResult:
    pytester.makepyfile(test_suite=SUITE)
    # Without a second run on fresh processes: the verdict on the reused ranks is the subject.
    return pytester.runpytest(
        "-p", "no:randomly", "--dist-mptc", "-o", "dist_confirm=off", *options
    )  # fmt: skip


def test_an_uneven_reduce_scatter_passes_and_a_desynced_one_fails(
    pytester: pytest.Pytester,
) -> None:
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    found = {name.rsplit("::", 1)[-1]: report for name, report in reports(result).items()}
    assert found["test_uneven"].passed
    failure = str(found["test_ops_differ"].longrepr)
    assert "CollectiveMismatch" in failure
    assert "rank 0 reduce_scatter(SUM, float32[2], [float32[2], float32[2]])" in failure
    assert "rank 1 reduce_scatter(MAX, float32[2], [float32[2], float32[2]])" in failure


@pytest.mark.parametrize(
    "option", [("--dist-no-collective-check",), ("-o", "dist_no_collective_check=true")]
)
def test_no_collective_check_reaches_mptc_tests(
    pytester: pytest.Pytester, option: tuple[str, ...]
) -> None:
    result = _run(pytester, *option)
    result.assert_outcomes(passed=2)
