"""Faults placed at collectives (:mod:`harness.faults`), acted out in the rank.

The recorder (:mod:`harness.rank.recording.recorder`) numbers each collective per process group as a
report does; where one of this rank's faults is placed at that number, it hands the call to
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
from typing import Any

import torch

from harness.faults import Fault

Fire = Callable[[int, str, bool], None]

# The parameters that hold a collective's input, in the order they are looked for.
_INPUTS = ("tensor", "input_tensor", "input", "input_list", "input_tensor_list", "scatter_list")


class Plan:
    """This rank's faults of one call, by place.

    Args:
        faults: Every rank's faults of the call (``CallOptions.faults``): ``rank``'s are kept.
        fire: Tells the controller that fault ``index`` acts: ``(index, what, ends)`` (``Fired``).
        exit: Ends the rank with a status (saving what must be saved first).
    """

    def __init__(
        self, faults: tuple[Fault, ...], rank: int, fire: Fire, exit: Callable[[int], object]
    ) -> None:
        self._placed = {(f.group, f.at): (i, f) for i, f in enumerate(faults) if f.rank == rank}
        self._fire, self._exit = fire, exit
        self._raised: BaseException | None = None

    def __bool__(self) -> bool:
        return bool(self._placed)

    def take(self, ranks: tuple[int, ...] | None, number: int) -> tuple[int, Fault] | None:
        """Take, once, the fault placed at collective ``number`` on the group of ``ranks``
        (None: the default group); None where there is none (always for a point-to-point
        op's 0: a fault's ``at`` is at least 1)."""
        key = None if ranks is None else tuple(sorted(ranks))
        return self._placed.pop((key, number), None)

    def act(
        self, placed: tuple[int, Fault], name: str, call: Callable[[], Any], inputs: Any
    ) -> Any:
        """Act out a fault at the collective ``name``, which ``call`` runs (``inputs``: its
        bound arguments, for ``corrupt``); return what the collective returns, when it runs."""
        index, fault = placed
        where = f"collective #{fault.at} ({name}) on {fault.group_name}"
        if fault.kind == "kill":
            what = f"killed ({signal.Signals(fault.signal).name}) {fault.when} {where}"
            result = call() if fault.when == "after" else None
            if fault.when == "during":
                _start_inside(call)
            self._fire(index, what, True)
            # A signal the rank handles or ignores leaves it running, as it would natively.
            os.kill(os.getpid(), fault.signal)
            return call() if fault.when == "before" else result
        if fault.kind == "exit":
            self._fire(index, f"exited with code {fault.code} before {where}", True)
            self._exit(fault.code)
        if fault.kind == "hang":
            self._fire(index, f"hung before {where}", True)
            threading.Event().wait()  # for good: the controller stops the rank
        if fault.kind == "delay":
            self._fire(index, f"was delayed {fault.seconds:g} s before {where}", False)
            time.sleep(fault.seconds)
            return call()
        if fault.kind == "corrupt":
            for tensor in _tensors(inputs):
                assert fault.fn is not None
                fault.fn(tensor)
            name_of = getattr(fault.fn, "__qualname__", repr(fault.fn))
            self._fire(index, f"had its input of {where} changed by {name_of}", False)
            return call()
        exc = fault.exc() if isinstance(fault.exc, type) else fault.exc
        assert exc is not None
        self._raised = exc
        self._fire(index, f"raised {exc!r} at {where}", False)
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
        return tuple(lines)


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
