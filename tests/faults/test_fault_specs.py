"""Fault specs: what each makes, how a sweep is laid out, and every bad input's message."""

from __future__ import annotations

import pickle
import signal

import pytest

from harness import fault_checks, faults


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
    ("make", "error", "message"),
    [
        (lambda: faults.kill(-1, 1), ValueError, "rank must be >= 0, got -1"),
        (lambda: faults.kill("1", 1), TypeError, "rank must be an int >= 0, not '1'"),
        (lambda: faults.kill(0, 0), ValueError, "at must be >= 1, got 0"),
        (lambda: faults.kill(0, 1, when="later"), ValueError, "unknown when 'later'; valid: "),
        (lambda: faults.kill(0, 1, signal=999), ValueError, "signal must be a signal number"),
        (lambda: faults.exit(0, 1, 256), ValueError, "code must be an exit status from 0 to 255"),
        (lambda: faults.error(0, 1, "boom"), TypeError, "exc must be an exception"),
        (lambda: faults.delay(0, 1, -1), ValueError, "seconds must be a finite number >= 0"),
        (lambda: faults.corrupt(0, 1, 3), TypeError, "fn must be callable"),
        (lambda: faults.hang(0, 1, group=[0, 1]), TypeError, "group must be a non-empty tuple"),
        (lambda: faults.hang(0, 1, group=(0, 0)), ValueError, "group (0, 0) names a rank twice"),
        (lambda: faults.hang(2, 1, group=(0, 1)), ValueError, "rank 2 is not a member of group"),
        (lambda: faults.hang(0, 1, strict="no"), TypeError, "strict must be True or False"),
        (lambda: faults.sweep("explode", ranks=[0], at=[1]), ValueError, "unknown fault kind"),
        (lambda: faults.sweep("kill", ranks=[], at=[1]), ValueError, "has no (rank, at) pair"),
    ],
)
def test_a_bad_spec_fails_when_made_naming_the_value(make, error, message) -> None:
    with pytest.raises(error) as raised:
        make()
    assert message in str(raised.value)


def test_faults_are_checked_against_the_world_they_run_in() -> None:
    assert fault_checks.checked([faults.kill(1, 1)], 2) == (faults.kill(1, 1),)
    with pytest.raises(ValueError, match=r"rank 4 is not in a world of 4 \(valid ranks: 0 to 3\)"):
        fault_checks.checked([faults.kill(4, 1)], 4)
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        fault_checks.checked([faults.hang(0, 1, group=(0, 2))], 2)
    with pytest.raises(TypeError, match="must be a list of faults"):
        fault_checks.checked(faults.kill(0, 1), 2)
    with pytest.raises(ValueError, match="both act at collective #1 of rank 0"):
        fault_checks.checked([faults.kill(0, 1), faults.delay(0, 1, 1.0)], 2)
