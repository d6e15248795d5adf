"""Faults placed by what their collective is (``faults.Collective``: its op, call site and
occurrence) on real Gloo ranks: where they land, what their ``FaultFired`` says, and that in
a DDP body they land on the same collective whatever torch records below
``torch.distributed``'s functions, where a number does not."""

from __future__ import annotations

import faults_rankfns as fns
import pytest

import harness
from harness import compat, faults
from harness.faults import Collective

TIMEOUT = 60.0
HOOKS = compat.collective_hooks_available()  # torch >= 2.14 records DDP's collectives
FLAG = fns.line_of("flag")


def _lost(fn: object, fault: faults.Fault) -> faults.FaultFired:
    """What ``fault`` did to rank 1 in a run of ``fn``, whose rank 0 copes with the loss."""
    survivor, lost = harness.run(fn, world_size=2, backend="gloo", faults=[fault], timeout=TIMEOUT)  # type: ignore[arg-type]
    assert survivor == "caught RuntimeError"
    assert isinstance(lost, faults.FaultFired)
    return lost


def test_a_fault_lands_on_the_nth_collective_of_its_op() -> None:
    with harness.World(2, backend="gloo", timeout=TIMEOUT) as world:
        survivor, lost = world.run(fns.mixed, faults=[faults.kill(1, Collective("all_reduce", 2))])
        assert survivor == "caught RuntimeError"
        site = fns.line_of("mixed all_reduce")
        assert isinstance(lost, faults.FaultFired)
        assert (lost.number, lost.op, lost.site, lost.origin) == (4, "all_reduce", site, "")
        assert str(lost) == (
            f"rank 1 killed (SIGKILL) before collective #4 (all_reduce at {site}) on the "
            "default group"
        )
        # By its call site alone: the 2nd collective issued at the broadcast's line.
        at = Collective(site=fns.line_of("mixed broadcast"), nth=2)
        _, lost = world.run(fns.mixed, faults=[faults.exit(1, at, 3)])
        assert (lost.number, lost.op) == (3, "broadcast")
        # One that never matched enough is an error saying how many did.
        third = faults.kill(1, Collective("all_reduce", 3, site=site))
        with pytest.raises(harness.FaultNotFired) as raised:
            world.run(fns.mixed, faults=[third])
        assert raised.value.summary == (
            f"fault {third} never fired: rank 1 issued 2 all_reduce at {site} on the default group"
        )


@pytest.mark.parametrize(
    "at", [Collective("all_reduce", site=FLAG), Collective(site=FLAG)], ids=["op-site", "site"]
)
def test_a_fault_placed_by_its_call_site_lands_on_the_same_collective_on_every_torch(
    at: Collective,
) -> None:
    lost = _lost(fns.ddp_then_all_reduce, faults.kill(1, at))
    assert (lost.op, lost.site, lost.origin) == ("all_reduce", FLAG, "")
    # DDP's own collectives come first where torch shows them: the number differs.
    assert (lost.number > 1) is HOOKS


def test_a_numbered_fault_lands_elsewhere_where_torch_records_ddps_collectives() -> None:
    lost = _lost(fns.ddp_then_all_reduce, faults.kill(1, 1))
    if HOOKS:  # DDP's constructor's first collective
        assert (lost.site, lost.origin) == (fns.line_of("ddp made"), "DistributedDataParallel()")
    else:
        assert (lost.op, lost.site) == ("all_reduce", FLAG)


def test_a_fault_line_names_the_collectives_origin() -> None:
    lost = _lost(fns.ddp_then_all_reduce, faults.kill(1, Collective("all_reduce")))
    if not HOOKS:  # DDP's all-reduce is not seen: the body's own is the first
        assert (lost.site, lost.origin) == (FLAG, "")
        return
    backward = fns.line_of("ddp backward")
    assert (lost.op, lost.site, lost.origin) == ("all_reduce", backward, "backward (DDP)")
    assert lost.what == (
        f"killed (SIGKILL) before collective #{lost.number} (all_reduce in backward (DDP) at "
        f"{backward}) on the default group"
    )
