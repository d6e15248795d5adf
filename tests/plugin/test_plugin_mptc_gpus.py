"""``--dist-mptc`` tests that record their GPU need (torch 2.15's ``_min_gpus_required``):
their world leases that many GPUs, which their ranks see; where the run has fewer, torch's
own decorator decides on the ranks, as natively (only ``--dist-require-gpus`` fails them).
Tried here with GPU ids that CUDA does not have (``--dist-gpus``), as on any CPU machine,
and with the attribute set by hand, as torch 2.15's decorators set it."""

from __future__ import annotations

import json
import os

import pytest
from plugin_testutil import TWO_RANKS

pytestmark = pytest.mark.usefixtures("torch_test_modules", "environment_restored")

SUITE = (
    TWO_RANKS
    + """
import json
import os

SEEN = {seen!r}


def needs(count):
    def mark(fn):
        fn._min_gpus_required = count  # as torch 2.15's skip_if_lt_x_gpu(count) records it
        return fn

    return mark


class TestGpus(TwoRanks):
    @needs(2)
    def test_two(self):
        with open(os.path.join(SEEN, f"two-{{self.rank}}"), "w") as f:
            json.dump(os.environ.get("CUDA_VISIBLE_DEVICES"), f)

    @needs(3)
    def test_three(self):
        with open(os.path.join(SEEN, f"three-{{self.rank}}"), "w") as f:
            json.dump(os.environ.get("CUDA_VISIBLE_DEVICES"), f)

    def test_none(self):
        with open(os.path.join(SEEN, f"none-{{self.rank}}"), "w") as f:
            json.dump(os.environ.get("CUDA_VISIBLE_DEVICES"), f)
"""
)


def _seen(directory: str) -> dict[str, object]:
    found = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as handle:
            found[name] = json.load(handle)
    return found


def test_a_tests_own_minimum_is_leased_or_left_to_its_decorator(
    pytester: pytest.Pytester, pids_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makepyfile(test_suite=SUITE.format(seen=pids_dir))
    result = pytester.runpytest("-rs", "-p", "no:randomly", "--dist-mptc", "--dist-gpus=0,1")
    # The hand-made marker skips nothing itself: test_three, short of GPUs, runs unleased,
    # where torch's skip_if_lt_x_gpu(3) would skip it with its own reason (or run it on the
    # CPU, allow_cpu=True); how torch's own decorators skip is compared with a native run
    # in test_plugin_mptc.py.
    result.assert_outcomes(passed=3)
    seen = _seen(pids_dir)
    # Both ranks see the lease, in its order, as native processes see one
    # CUDA_VISIBLE_DEVICES; a test that leases none sees what pytest sees.
    assert (seen["two-0"], seen["two-1"]) == ("0,1", "0,1")
    assert (seen["three-0"], seen["three-1"]) == (None, None)
    assert (seen["none-0"], seen["none-1"]) == (None, None)


def test_require_gpus_fails_a_mptc_test_it_would_skip(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    pytester.makepyfile(test_suite=SUITE.format(seen=pids_dir))
    result = pytester.runpytest(
        "-p", "no:randomly", "--dist-mptc", "--dist-gpus=0,1", "--dist-require-gpus", "-k", "three"
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*needs 3 GPUs (the test's _min_gpus_required), this run has 2*"])
