"""Faults to place at a rank's collective: what a test of fault-tolerant code injects.

A fault acts on one rank at collective ``#at`` of a process group, numbered from 1 per group
exactly as a report's collectives section numbers them, or at a :class:`Collective` named by
what it is (its op, call site and occurrence, which stay put where torch releases number
collectives differently): ``kill`` (before, during or after the
collective), ``exit``, ``error`` (the collective raises), ``delay`` (a straggler), ``hang``
(the rank never enters) and ``corrupt`` (the rank's input tensor is changed first). Faults
go to the marker (``@pytest.mark.distributed(faults=[...])``), ``World.run(fn, faults=[...])``
and ``harness.run(..., faults=[...])``; :func:`sweep` makes one fault per (rank, collective)
pair, and the marker turns a sweep into one test case per fault.

A rank's death or error caused by a fault is not a failure by itself: the call's verdict is
what the other ranks did. A fault that never fires is an error (``strict=False`` allows it).

A spec is checked when a run uses it (``World.run``, ``harness.run``, or the test it marks),
against the world's size too, before any process starts: a bad one (``kill(rank=1, at=0)``)
fails that run or test alone, never the import of the module that makes it; so does a
sweep whose arguments make none (``sweep("explode", ...)``).

The record of a fault, :class:`Fault`, of where it acts, :class:`Collective`, and of what
it did, :class:`FaultFired`, are public here with the makers. The package imports neither
torch nor pytest.
"""

from __future__ import annotations

from harness.faults.makers import corrupt, delay, error, exit, hang, kill
from harness.faults.places import Collective
from harness.faults.sweeps import ALL, InvalidSweep, OpenSweep, Sweep, sweep
from harness.faults.values import KINDS, WHEN, Fault, FaultFired

__all__ = [
    "ALL",
    "KINDS",
    "WHEN",
    "Collective",
    "Fault",
    "FaultFired",
    "InvalidSweep",
    "OpenSweep",
    "Sweep",
    "corrupt",
    "delay",
    "error",
    "exit",
    "hang",
    "kill",
    "sweep",
]
