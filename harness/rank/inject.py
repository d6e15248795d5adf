"""Faults placed at collectives (:mod:`harness.faults`), acted out in the rank.

The recorder (:mod:`harness.rank.recording.recorder`) numbers each collective per process
group as a report does; where one of this rank's faults is placed at that number, or at what
that collective is (its op, call site and occurrence: :meth:`Plan.take`), it hands the call to
:meth:`Plan.act` instead of calling torch. Before the fault acts, the rank tells the
controller (``Fired``): a killed rank could not say it afterwards.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from harness.faults import Collective, Fault
from harness.protocol.traces import call_text, where

if TYPE_CHECKING:
    from harness.rank.recording.records import Record

# The parameters that hold a collective's input, in the order they are looked for.
_INPUTS = ("tensor", "input_tensor", "input", "input_list", "input_tensor_list", "scatter_list")


class Target(NamedTuple):
    """The collective a fault acts at, as ``Fired`` names it: its number on its group, op,
    call site (``x.py:3``; '' where unknown) and origin (see ``Op.origin``)."""

    number: int
    op: str
    site: str
    origin: str

    @classmethod
    def of(cls, record: Record) -> Target:
        """The target that ``record``'s collective is."""
        return cls(record.seq, record.op.name, where(*record.place), record.op.origin)

    @property
    def text(self) -> str:
        """``collective #5 (all_reduce in backward (DDP) at train.py:40)``."""
        return f"collective #{self.number} ({call_text(self.op, self.site, self.origin)})"


Fire = Callable[[int, str, bool, Target], None]


class Plan:
    """This rank's faults of one call, by place: a collective's number on its group, or what
    the collective is (a :class:`~harness.faults.Collective`, matched as the rank issues them).

    Args:
        faults: Every rank's faults of the call (``CallOptions.faults``): ``rank``'s are kept.
        fire: Tells the controller that fault ``index`` acts: ``(index, what, ends, target)``
            (``Fired``).
        exit: Ends the rank with a status (saving what must be saved first).
    """

    def __init__(
        self, faults: tuple[Fault, ...], rank: int, fire: Fire, exit: Callable[[int], object]
    ) -> None:
        mine = [(i, f) for i, f in enumerate(faults) if f.rank == rank]
        self._placed = {(f.group, f.at): (i, f) for i, f in mine if isinstance(f.at, int)}
        # Those placed by what their collective is, each with how many matched so far.
        self._matching = {i: _Matching(f) for i, f in mine if isinstance(f.at, Collective)}
        # Those that matched a collective another fault acted at: with that fault, and where.
        self._collided: list[tuple[Fault, Fault, Target]] = []
        self._fire, self._exit = fire, exit
        self._raised: BaseException | None = None

    def __bool__(self) -> bool:
        # A fault that collided is kept: its unfired line says so.
        return bool(self._placed or self._matching or self._collided)

    def take(self, record: Record) -> tuple[int, Fault] | None:
        """Take, once, the fault placed at ``record``'s collective: by its number on its
        group, or by what it is; None where there is none (always for a point-to-point op,
        numbered 0)."""
        if not record.seq:
            return None
        ranks = record.group.ranks
        key = None if ranks is None else tuple(sorted(ranks))
        found = self._placed.pop((key, record.seq), None)
        if not self._matching:
            return found
        file, line = record.place
        for index, matching in list(self._matching.items()):
            fault = matching.fault
            assert isinstance(fault.at, Collective)
            if fault.group != key or not fault.at.matches(record.op.name, file, line):
                continue
            matching.seen += 1
            if matching.seen < fault.at.nth:
                continue
            del self._matching[index]
            if found is None:
                found = (index, fault)
            else:
                self._collided.append((fault, found[1], Target.of(record)))
        return found

    def act(
        self, placed: tuple[int, Fault], record: Record, call: Callable[[], Any], inputs: Any
    ) -> Any:
        """Act out a fault at ``record``'s collective, which ``call`` runs (``inputs``: its
        bound arguments, for ``corrupt``); return what the collective returns, when it runs."""
        index, fault = placed
        target = Target.of(record)
        point = f"{target.text} on {fault.group_name}"
        if fault.kind == "kill":
            what = f"killed ({signal.Signals(fault.signal).name}) {fault.when} {point}"
            result = call() if fault.when == "after" else None
            if fault.when == "during":
                _start_inside(call)
            self._fire(index, what, True, target)
            # A signal the rank handles or ignores leaves it running, as it would natively.
            os.kill(os.getpid(), fault.signal)
            return call() if fault.when == "before" else result
        if fault.kind == "exit":
            self._fire(index, f"exited with code {fault.code} before {point}", True, target)
            self._exit(fault.code)
        if fault.kind == "hang":
            self._fire(index, f"hung before {point}", True, target)
            threading.Event().wait()  # for good: the controller stops the rank
        if fault.kind == "delay":
            self._fire(index, f"was delayed {fault.seconds:g} s before {point}", False, target)
            time.sleep(fault.seconds)
            return call()
        if fault.kind == "corrupt":
            for tensor in _tensors(inputs):
                assert fault.fn is not None
                fault.fn(tensor)
            name_of = getattr(fault.fn, "__qualname__", repr(fault.fn))
            self._fire(index, f"had its input of {point} changed by {name_of}", False, target)
            return call()
        exc = fault.exc() if isinstance(fault.exc, type) else fault.exc
        assert exc is not None
        self._raised = exc
        self._fire(index, f"raised {exc!r} at {point}", False, target)
        raise exc

    def caused(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the error a fault raised, or was raised while handling it."""
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            if current is self._raised:
                return True
            seen.add(id(current))
            current = current.__cause__ or current.__context__
        return False

    def unfired(self, counts: Mapping[tuple[int, ...] | None, int], rank: int) -> tuple[str, ...]:
        """The error line of each strict fault that never fired; ``counts``: the collectives
        the call issued on each group (by its sorted ranks; None: default)."""
        lines = []
        for _, fault in self._placed.values():
            if fault.strict:
                made = counts.get(fault.group, 0)
                collectives = "collective" if made == 1 else "collectives"
                lines.append(
                    f"fault {fault} never fired: rank {rank} made {made} {collectives} on "
                    f"{fault.group_name}"
                )
        for matching in self._matching.values():
            fault = matching.fault
            if fault.strict:
                lines.append(
                    f"fault {fault} never fired: rank {rank} issued {matching.found()} on "
                    f"{fault.group_name}"
                )
        for fault, other, target in self._collided:
            if fault.strict:
                lines.append(
                    f"fault {fault} never fired: {other} acted at the same collective, "
                    f"{target.text} on {fault.group_name}"
                )
        return tuple(lines)


class _Matching:
    """A fault placed by what its collective is, and how many collectives matched so far."""

    def __init__(self, fault: Fault) -> None:
        self.fault, self.seen = fault, 0

    def found(self) -> str:
        """What matched, as its unfired line says: ``1 all_reduce at train.py:34``."""
        at = self.fault.at
        assert isinstance(at, Collective)
        what = at.op or ("collective" if self.seen == 1 else "collectives")
        return f"{self.seen} {what}" + (f" at {at.site}" if at.site is not None else "")


def bound(fn: Callable[..., Any], args: Any, kwargs: Any) -> Mapping[str, Any]:
    """``fn``'s arguments by parameter name; ``{}`` where they do not bind."""
    try:
        return inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return {}


def _tensors(arguments: Mapping[str, Any]) -> list[torch.Tensor]:
    """The input tensors of a collective: its first input parameter's tensor (or list)."""
    for name in _INPUTS:
        value = arguments.get(name)
        if isinstance(value, torch.Tensor):
            return [value]
        if isinstance(value, (list, tuple)) and value:
            return [item for item in value if isinstance(item, torch.Tensor)]
    return [value for value in arguments.values() if isinstance(value, torch.Tensor)][:1]


def _start_inside(call: Callable[[], Any]) -> None:
    """Start the collective on a helper thread; return once it is inside torch's call (that
    thread releases the interpreter lock there, which lets this one run again)."""
    entered = threading.Event()

    def enter() -> None:
        entered.set()
        # The rank is being killed: what the collective raises meanwhile is moot.
        with contextlib.suppress(BaseException):
            call()

    threading.Thread(target=enter, name="harness-fault", daemon=True).start()
    entered.wait()
    time.sleep(0.001)  # give the thread the interpreter lock back until it blocks in torch
