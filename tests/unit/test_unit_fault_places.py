"""Faults placed by what their collective is (``faults.Collective``), without ranks: what is
valid and how a bad value is named, how a placed fault reads, what it matches."""

from __future__ import annotations

import fnmatch

import pytest

from harness import faults
from harness.faults import Collective, checks
from harness.faults.places import OPS, P2P, ordinal

SECOND = Collective("all_reduce", 2, site="train.py:34")


@pytest.mark.parametrize(
    ("at", "message"),
    [
        pytest.param(
            Collective(),
            "a Collective needs op or site (a collective by its number alone is at=N)",
            id="nothing",
        ),
        pytest.param(
            Collective("allreduce"),
            "op must be a collective's name, one of all_reduce, all_reduce_coalesced, "
            "broadcast, *; not 'allreduce'",
            id="op",
        ),
        pytest.param(
            Collective("send"),
            "op 'send' is a point-to-point op: it has no number and carries no fault",
            id="p2p",
        ),
        pytest.param(
            Collective("barrier", 0),
            "nth must be an int >= 1 (the first match is 1), not 0",
            id="nth",
        ),
        pytest.param(
            Collective("barrier", True),  # type: ignore[arg-type]
            "nth must be an int >= 1 (the first match is 1), not True",
            id="nth-bool",
        ),
        pytest.param(
            Collective(site="train.py:x"),
            "site must be a call site as reports show it, 'train.py:34' (or 'train.py' for "
            "any line of the file), not 'train.py:x'",
            id="site",
        ),
        pytest.param(
            Collective(site="train.py:0"),
            "site must be a call site as reports show it, *, not 'train.py:0'",
            id="site-line-0",
        ),
        pytest.param(
            Collective(site=34),  # type: ignore[arg-type]
            "site must be a call site as reports show it, *, not 34",
            id="site-int",
        ),
    ],
)
def test_each_bad_value_of_a_collective_is_named_with_what_is_valid(
    at: Collective, message: str
) -> None:
    assert fnmatch.fnmatchcase(at.problem(), message), at.problem()
    # Made freely (a module's import never fails), it fails the run that uses it.
    fault = faults.kill(1, at)
    with pytest.raises(ValueError) as raised:
        checks.checked([fault], 2)
    assert str(raised.value).startswith(f"fault kill(rank=1, at={at}): at={at}: ")


@pytest.mark.parametrize(
    "at",
    [
        Collective("all_reduce"),
        Collective("broadcast", 3),
        Collective(site="train.py"),
        Collective(site="mylib/train.py:34", nth=2),
        Collective("collective", site="/work/x.py:3"),
    ],
)
def test_valid_collectives_have_no_problem(at: Collective) -> None:
    assert at.problem() == ""
    assert faults.delay(0, at, 0.0).problem() == ""


def test_a_number_that_is_no_collective_says_both_are_valid() -> None:
    assert faults.kill(1, "3").problem() == (  # type: ignore[arg-type]
        "at must be an int >= 1 (collectives are counted from 1) or a faults.Collective, not '3'"
    )


def test_how_a_placed_fault_reads() -> None:
    fault = faults.kill(1, SECOND, when="after")
    assert str(SECOND) == "Collective('all_reduce', 2, site='train.py:34')"
    assert repr(SECOND) == "faults.Collective('all_reduce', 2, site='train.py:34')"
    assert str(Collective(site="x.py:3", nth=4)) == "Collective(nth=4, site='x.py:3')"
    assert str(Collective("barrier")) == "Collective('barrier')"
    assert str(fault) == (
        "kill(rank=1, at=Collective('all_reduce', 2, site='train.py:34'), when='after')"
    )
    # What a report offers to paste (an @example(...) line) runs where faults is imported.
    assert repr(fault) == (
        "faults.kill(rank=1, at=faults.Collective('all_reduce', 2, site='train.py:34'), "
        "when='after')"
    )
    assert eval(repr(fault), {"faults": faults}) == fault
    assert fault.id == "kill-after-r1-all_reduce2-at-train.py-34"
    assert faults.hang(0, Collective(site="x.py")).id == "hang-r0-any1-at-x.py"
    assert SECOND.text == "the 2nd all_reduce at train.py:34"
    assert fault.point == "the 2nd all_reduce at train.py:34"
    assert faults.kill(1, 3).point == "collective #3"
    assert Collective(site="x.py:3", nth=11).text == "the 11th collective at x.py:3"


def test_ordinals() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "101st",
        "111th",
    ]


def test_what_a_collective_matches() -> None:
    assert SECOND.matches("all_reduce", "/src/train.py", 34)
    assert SECOND.matches("all_reduce", "C:\\src\\train.py", 34)
    assert not SECOND.matches("all_reduce", "/src/train.py", 35)
    assert not SECOND.matches("broadcast", "/src/train.py", 34)
    assert not SECOND.matches("all_reduce", "/src/mytrain.py", 34)  # another file's name
    in_file = Collective(site="pkg/train.py")
    assert in_file.matches("barrier", "/src/pkg/train.py", 1)
    assert not in_file.matches("barrier", "/src/other/train.py", 1)
    assert Collective("barrier").matches("barrier", "?", 0)


def test_two_faults_at_the_same_placed_collective_clash_and_a_number_does_not() -> None:
    with pytest.raises(ValueError, match=r"both act at the 2nd all_reduce at train\.py:34 of"):
        checks.checked([faults.kill(1, SECOND), faults.delay(1, SECOND, 1.0)], 2)
    # Whether #5 is that collective is known as the rank runs: there, the later one is
    # reported as never fired, saying which fault acted instead.
    assert len(checks.checked([faults.kill(1, SECOND), faults.delay(1, 5, 1.0)], 2)) == 2


def test_a_sweep_takes_placed_collectives() -> None:
    places = [Collective("all_reduce", n) for n in (1, 2)]
    swept = faults.sweep("exit", ranks=[0, 1], at=places, code=3)
    assert isinstance(swept, faults.Sweep)
    assert [f.id for f in swept] == [
        "exit-r0-all_reduce1",
        "exit-r0-all_reduce2",
        "exit-r1-all_reduce1",
        "exit-r1-all_reduce2",
    ]
    opened = faults.sweep("kill", ranks="all", at=places)
    assert isinstance(opened, faults.OpenSweep)
    assert [f.at for f in opened.faults(1)] == places


def test_the_ops_are_those_the_ranks_record() -> None:
    from harness.rank.recording import describe, functional, hook_ops

    recorded = {name for name in describe.TRACED if name not in P2P}
    recorded |= {kind.name for kind in hook_ops.KINDS.values() if not kind.p2p}
    recorded |= {name for name, _ in functional._FUNCTIONS.values()}
    assert set(OPS) == recorded
    assert set(P2P) == {name for name in describe.TRACED if name not in OPS}
