"""Tests run under seeded schedules: a race found, reported with its seed and holds, shrunk,
confirmed on fresh processes and replayed from its seed; passing tests' summary lines; the
opt-out; bad values failing their test alone; ``tmp_path`` put back between runs; and the
schedules of ``@given`` tests, ``--dist-mptc`` classes and fault sweeps."""

from __future__ import annotations

import re

import pytest
from plugin_testutil import TWO_RANKS

RACE = """
import pytest
import torch
import torch.distributed as dist


def evaluate():
    with torch.no_grad():
        for _ in range(50):
            torch.nn.Linear(8, 8)(torch.randn(256, 8))


@pytest.mark.distributed(world_size=2, schedules=20, schedule_delay=60)
def test_race(rank, tmp_path):
    dist.all_reduce(torch.ones(1))
    path = tmp_path / "saved"
    if rank == 0:
        path.write_text("saved")
    else:
        evaluate()  # rank 0 has written by then, nearly always: the race hides
        assert path.exists(), "rank 0 has not saved yet"
    dist.barrier()
"""


def test_a_race_is_found_shrunk_confirmed_and_replays_from_its_seed(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_race=RACE)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    found = re.search(r"^schedule (\d+) of 20 \(seed (\d+); 2 ranks, 8 boundaries\)", out, re.M)
    if found is None:  # the first run, without holds, lost the race by itself
        assert "AssertionError: rank 0 has not saved yet" in out
        pytest.skip("the race showed without a schedule; nothing of schedules to check")
    seed = found.group(2)
    assert found.group(1) == seed  # the seeds are 1 to N
    result.stdout.fnmatch_lines(
        [
            f"schedule {seed} of 20 (seed {seed}; 2 ranks, 8 boundaries) failed 2 runs of 2;*",
            "  rank * held at boundary *",
            "shrunk to 1 hold that still fails every run:",
            "  rank 0 held at boundary 2, after collective #1 (all_reduce) at test_race.py:* "
            "returned: * s, until its peers were blocked",
            "confirmed on fresh processes; run (2 ranks, gloo): pytest "
            f"test_race.py::test_race --dist-backend=gloo --dist-schedule-seed={seed}",
        ]
    )
    again = pytester.runpytest("-p", "no:randomly", f"--dist-schedule-seed={seed}")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(
        [
            f"the schedule (seed {seed}; 2 ranks, 8 boundaries) failed 2 runs of 2; its holds:",
            "  rank 0 held at boundary 2, after collective #1 (all_reduce) at *",
        ]
    )


def test_a_test_that_passes_its_schedules_says_what_they_bound(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_fixed="""
import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, schedules=5)
def test_fixed(rank, tmp_path):
    dist.all_reduce(torch.ones(1))
    path = tmp_path / "saved"
    if rank == 0:
        path.write_text("saved")
    dist.barrier()
    assert path.read_text() == "saved"


@pytest.mark.distributed(world_size=2, schedules=0)
def test_timing_by_design(rank):
    dist.barrier()


@pytest.mark.distributed(world_size=1)
def test_alone(rank):
    dist.barrier()
"""
    )
    result = pytester.runpytest("-p", "no:randomly", "--dist-schedules=3")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*= harness: schedules =*",
            "test_fixed.py::test_fixed: 5 schedules passed (2 ranks, 8 boundaries): a race "
            "that holding one rank at one boundary shows escaped them all with probability "
            "<= 0.51",
            "test_fixed.py::test_alone: no schedule ran (1 rank)",
        ]
    )
    assert "test_timing_by_design" not in result.stdout.str()


def test_each_run_starts_from_tmp_path_as_the_fixtures_left_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_fresh="""
import pytest
import torch.distributed as dist


@pytest.fixture
def config(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return tmp_path / "config.json"


@pytest.mark.distributed(world_size=2, schedules=3)
def test_first_writer(rank, tmp_path, config):
    dist.barrier()
    if rank == 0:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
        (tmp_path / "out").write_text("written")
    dist.barrier()
"""
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["test_fresh.py::test_first_writer: 3 schedules passed*"])


BAD_ARGUMENTS = {
    "schedules=-1": "schedules must be >= 0, got -1",
    "schedules='many'": "schedules must be an int >= 0, not 'many'",
    "schedule_seed=1.5": "schedule_seed must be an int >= 0 (a seed), not 1.5",
    "schedule_delay=0": "schedule_delay must be a positive number of seconds, got 0",
}


def test_a_bad_schedule_argument_fails_its_test_alone(pytester: pytest.Pytester) -> None:
    bad = "".join(
        f"\n\n@pytest.mark.distributed(world_size=2, {argument})\ndef test_bad_{n}(rank):\n"
        "    pass\n"
        for n, argument in enumerate(BAD_ARGUMENTS)
    )
    good = "\n\n@pytest.mark.distributed(world_size=2, schedules=1)\ndef test_good(rank):\n"
    pytester.makepyfile(test_bad=f"import pytest\n{bad}{good}    pass\n")
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=len(BAD_ARGUMENTS), passed=1)
    out = result.stdout.str()
    for message in BAD_ARGUMENTS.values():
        assert f"invalid @pytest.mark.distributed: {message}" in out


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--dist-schedules=some", "--dist-schedules must be an int >= 0, not 'some'"),
        ("--dist-schedule-seed=x7", "--dist-schedule-seed must be an int >= 0 (a seed), not 'x7'"),
        ("--dist-schedule-delay=0", "--dist-schedule-delay must be a positive number of seconds"),
    ],
)
def test_a_bad_schedule_option_is_a_usage_error_naming_it(
    pytester: pytest.Pytester, option: str, message: str
) -> None:
    pytester.makepyfile(test_any="def test_any():\n    pass\n")
    result = pytester.runpytest(option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_a_given_test_draws_its_schedule_and_its_minimal_example_tells_the_holds(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("hypothesis")
    pytester.makepyfile(
        test_given="""
import pytest
import torch
import torch.distributed as dist
from hypothesis import example, given, settings, strategies as st

from harness import Schedule
from harness.strategies import schedules


@settings(database=None, derandomize=True, max_examples=5)
@given(schedule=schedules(ranks=range(2), at=range(1, 5)))
@example(schedule=Schedule(holds=((0, 2),), delay=60))
@pytest.mark.distributed(world_size=2)
def test_race(rank, tmp_path, schedule):
    dist.all_reduce(torch.ones(1))
    path = tmp_path / "saved"
    if rank == 0:
        path.write_text("saved")
    else:
        assert path.exists(), "rank 0 has not saved yet"
    dist.barrier()


@given(n=st.integers(0, 3))
@pytest.mark.distributed(world_size=2, schedules=5)
def test_marked(rank, n):
    pass
"""
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "minimal example (2 ranks, * examples run): "
            "test_race(schedule=Schedule(holds=((0, 2),), delay=60))",
            "  rank 0 held at boundary 2, after collective #1 (all_reduce) at test_given.py:* "
            "returned: * s, until its peers were blocked",
            "to replay it first, add above @given: "
            "@example(schedule=Schedule(holds=((0, 2),), delay=60))",
        ]
    )
    assert (
        "test_marked is a @given test: draw its schedule as another argument, @given(..., "
        "schedule=harness.strategies.schedules(ranks=range(2))), instead of the marker's"
    ) in result.stdout.str()


def test_mptc_classes_and_fault_sweeps_run_their_schedules(pytester: pytest.Pytester) -> None:
    # Each run of a class's test starts from its setUp, run again: a new directory here.
    pytester.makepyfile(
        test_both=TWO_RANKS
        + """
import os
import shutil
import tempfile

import pytest

from harness import faults


class Case(TwoRanks):
    # Each run starts from what setUp makes, as a native test does: a new directory.
    def setUp(self):
        self.run_dir = tempfile.mkdtemp()
        os.environ["RUN_DIR"] = self.run_dir
        super().setUp()

    def tearDown(self):
        shutil.rmtree(self.run_dir)
        super().tearDown()

    def test_all_reduce(self):
        self.init_gloo()
        total = torch.ones(1)
        dist.all_reduce(total)
        self.assertEqual(total.item(), 2.0)
        self.assertEqual(os.listdir(os.environ["RUN_DIR"]), [])
        dist.barrier()
        open(os.path.join(os.environ["RUN_DIR"], str(self.rank)), "w").close()
        dist.destroy_process_group()


@pytest.mark.distributed(world_size=2, faults=faults.sweep("kill", ranks=[1], at=[2]))
def test_survivor(rank):
    dist.all_reduce(torch.ones(1))
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError:
        pass
"""
    )
    result = pytester.runpytest("-p", "no:randomly", "--dist-mptc", "--dist-schedules=2")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "test_both.py::Case::test_all_reduce: 2 schedules passed (2 ranks, 8 boundaries)*",
            "test_both.py::test_survivor[[]kill-r1-at2[]]: 2 schedules passed (2 ranks, *",
        ]
    )
