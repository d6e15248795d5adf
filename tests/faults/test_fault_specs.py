"""Fault specs: what each makes, how a sweep is laid out, and every bad input's message."""

from __future__ import annotations

import pickle
import re
import signal

import pytest

from harness import faults
from harness.faults import checks


def negate(tensor):  # a module-level corruption: it must pickle
    tensor.neg_()


def test_each_kind_names_itself_in_reports_and_ids() -> None:
    assert str(faults.kill(1, 3)) == "kill(rank=1, at=3)"
    assert faults.kill(1, 3).id == "kill-r1-at3"
    during = faults.kill(1, 3, when="during", signal=signal.SIGTERM, group=(1, 0))
    assert str(during) == "kill(rank=1, at=3, when='during', signal=SIGTERM, group=(0, 1))"
    assert during.id == "kill-during-r1-at3-g0_1"
    assert str(faults.exit(0, 2, 3)) == "exit(rank=0, at=2, code=3)"
    assert (
        str(faults.error(0, 1, RuntimeError("x"))) == "error(rank=0, at=1, exc=RuntimeError('x'))"
    )
    assert str(faults.delay(2, 1, 0.5)) == "delay(rank=2, at=1, seconds=0.5)"
    assert str(faults.hang(0, 4)) == "hang(rank=0, at=4)"
    assert str(faults.corrupt(0, 1, negate)) == "corrupt(rank=0, at=1, fn=negate)"


def test_faults_pickle_to_travel_to_the_ranks() -> None:
    spec = faults.corrupt(1, 2, negate, group=(0, 1))
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_a_sweep_is_every_rank_and_collective_pair_in_order() -> None:
    swept = faults.sweep(faults.kill, ranks=range(3), at=range(1, 4), when="after")
    assert isinstance(swept, faults.Sweep)
    assert [(f.rank, f.at, f.when) for f in swept] == [
        (r, n, "after") for r in range(3) for n in range(1, 4)
    ]
    assert [f.id for f in faults.sweep("exit", ranks=[1], at=[2], code=1)] == ["exit-r1-at2"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: faults.kill(-1, 1), "rank must be an int >= 0, not -1"),
        (lambda: faults.kill("1", 1), "rank must be an int >= 0, not '1'"),
        (
            lambda: faults.kill(0, 0),
            "fault kill(rank=0, at=0): at must be an int >= 1 (collectives are counted from 1) "
            "or a faults.Collective, not 0",
        ),
        (lambda: faults.kill(0, 1, when="later"), "unknown when 'later'; valid: "),
        (lambda: faults.kill(0, 1, signal=999), "signal must be a signal number"),
        (lambda: faults.exit(0, 1, 256), "code must be an exit status from 0 to 255"),
        (lambda: faults.error(0, 1, "boom"), "exc must be an exception"),
        (lambda: faults.delay(0, 1, -1), "seconds must be a finite number >= 0"),
        (lambda: faults.corrupt(0, 1, 3), "fn must be callable"),
        (lambda: faults.hang(0, 1, group=[0, 1]), "group must be a non-empty tuple"),
        (lambda: faults.hang(0, 1, group=(0, 0)), "group (0, 0) names a rank twice"),
        (lambda: faults.hang(2, 1, group=(0, 1)), "rank 2 is not a member of group"),
        (lambda: faults.hang(0, 1, strict="no"), "strict must be True or False"),
    ],
)
def test_a_bad_spec_fails_when_a_run_checks_it_naming_the_fault_and_value(make, message) -> None:
    made = make()  # at a test module's import: nothing fails yet
    with pytest.raises(ValueError) as raised:
        checks.checked([made], 4)
    assert str(raised.value).startswith(f"fault {made}: ")
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: faults.sweep("explode", ranks=[0], at=[1]), "unknown fault kind"),
        (lambda: faults.sweep("kill", ranks=[], at=[1]), "has no (rank, at) pair"),
    ],
)
def test_a_sweep_of_no_kind_or_no_case_fails_when_a_run_checks_it(make, message) -> None:
    made = make()  # at a test module's import: nothing fails yet
    with pytest.raises(ValueError) as raised:
        checks.checked(made, 4)
    assert str(raised.value).startswith("sweep(")
    assert message in str(raised.value)
    with pytest.raises(ValueError, match=re.escape(message)):
        list(made)  # iterated over, as for World.run: the same error


def test_faults_are_checked_against_the_world_they_run_in() -> None:
    assert checks.checked([faults.kill(1, 1)], 2) == (faults.kill(1, 1),)
    with pytest.raises(ValueError, match=r"rank 4 is not in a world of 4 \(valid ranks: 0 to 3\)"):
        checks.checked([faults.kill(4, 1)], 4)
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        checks.checked([faults.hang(0, 1, group=(0, 2))], 2)
    with pytest.raises(TypeError, match="must be a list of faults"):
        checks.checked(faults.kill(0, 1), 2)
    with pytest.raises(ValueError, match="both act at collective #1 of rank 0"):
        checks.checked([faults.kill(0, 1), faults.delay(0, 1, 1.0)], 2)
