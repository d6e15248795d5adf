"""Functional collectives recorded on torch without process-group hooks (< 2.14).

DTensor, tensor parallelism and user code issue functional collectives
(``torch.distributed._functional_collectives``: ``all_reduce(tensor, "sum", group)``,
``all_gather_tensor``...), which go to torch's C++ without passing ``torch.distributed``'s
functions. Where torch's hooks see them (:mod:`harness.rank.recording.hooks`), nothing here
is installed. Elsewhere :func:`install` wraps the module's Python functions as
:mod:`harness.rank.recording.recorder` wraps ``torch.distributed``'s, once per rank: DTensor
calls them through the module (``funcol.all_reduce(...)``), so the wrappers see its
collectives. Each reads as the ``torch.distributed`` function that does the same, so that a
rank calling either agrees: ``all_gather_tensor`` as ``all_gather_into_tensor``, its reduce
op (``"sum"``) as ``SUM``. A functional collective returns a tensor to wait for: its record
reads issued once the function returned, in flight while a thread waits for it
(``wait_tensor``, wrapped too), completed after.

Not seen: the same ops called straight through ``torch.ops._c10d_functional`` (a compiled
graph does), and collectives issued in C++ alone (DDP's).

Imports: see :mod:`harness.rank`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from harness import compat
from harness.protocol.traces import COMPLETED, IN_FLIGHT, RAISED
from harness.rank.recording.describe import (
    DTYPES,
    REDUCE_OP,
    ROOT,
    TENSOR,
    TENSORS,
    ArgKind,
    OpArg,
    Spec,
    spec,
)
from harness.rank.recording.recorder import current
from harness.rank.recording.records import Awaited


def _always_async(value: Any, param: str, facts: Any) -> tuple[str, str]:
    facts.async_op = True  # a functional collective returns a tensor to wait on
    return "", ""


def _reduce_op(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else REDUCE_OP.raw(value)


_ASYNC = OpArg("self", ArgKind(lambda value: True, _always_async), shown=False, compared=False)
_OP = OpArg("reduceOp", ArgKind(_reduce_op, REDUCE_OP.text))
_IN = OpArg("self", TENSOR)
_INS = OpArg("self", TENSORS)

_FUNCTIONS: dict[str, tuple[str, tuple[OpArg, ...]]] = {
    "broadcast": ("broadcast", (OpArg("src", ROOT), _IN)),
    "all_reduce": ("all_reduce", (_OP, _IN)),
    "all_reduce_coalesced": ("all_reduce_coalesced", (_OP, _INS)),
    "all_gather_tensor": ("all_gather_into_tensor", (_IN,)),
    "all_gather_tensor_autograd": ("all_gather_into_tensor", (_IN,)),
    "all_gather_single": ("all_gather_into_tensor", (_IN,)),
    "all_gather_single_autograd": ("all_gather_into_tensor", (_IN,)),
    "all_gather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", (_INS,)),
    "all_gather_single_coalesced": ("all_gather_into_tensor_coalesced", (_INS,)),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", (_OP, _IN)),
    "reduce_scatter_tensor_autograd": ("reduce_scatter_tensor", (_OP, _IN)),
    "reduce_scatter_single": ("reduce_scatter_tensor", (_OP, _IN)),
    "reduce_scatter_single_autograd": ("reduce_scatter_tensor", (_OP, _IN)),
    "reduce_scatter_tensor_coalesced": (
        "reduce_scatter_tensor_coalesced",
        (_OP, OpArg("inputs", TENSORS)),
    ),
    "reduce_scatter_single_coalesced": (
        "reduce_scatter_tensor_coalesced",
        (_OP, OpArg("inputs", TENSORS)),
    ),
    # Split sizes differ by rank: only the dtype must agree.
    "all_to_all_single": (
        "all_to_all_single",
        (OpArg("self", TENSOR, compared=False), OpArg("self", DTYPES, shown=False)),
    ),
    "all_to_all_single_autograd": (
        "all_to_all_single",
        (OpArg("self", TENSOR, compared=False), OpArg("self", DTYPES, shown=False)),
    ),
}
"""The functional collectives wrapped (those this torch has): the ``torch.distributed``
function each reads as, and the arguments that describe a call."""

_ORIGINAL = "__harness_traced__"


def install() -> None:
    """Wrap the functional collectives, once per process; nothing where torch's hooks see
    them (torch >= 2.14) or torch has none."""
    if compat.collective_hooks_available():
        return
    funcol = compat.functional_collectives()
    if funcol is None:
        return
    for name, (reads_as, described) in _FUNCTIONS.items():
        original = getattr(funcol, name, None)
        if original is None or hasattr(original, _ORIGINAL):
            continue
        try:
            made = spec(reads_as, original, (*described, _ASYNC))
        except (TypeError, ValueError):
            continue  # a signature that cannot be read: left unwrapped
        setattr(funcol, name, _wrap(original, made))
    wait = getattr(funcol, "wait_tensor", None)
    if wait is not None and not hasattr(wait, _ORIGINAL):
        funcol.wait_tensor = _wrap_wait(wait)


def _wrap(fn: Callable[..., Any], made: Spec) -> Callable[..., Any]:
    at = made.group_at

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        # Traced by torch.compile: what it traces must stay torch's, untouched.
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        recorder = current()
        if recorder is None or (recorder.busy and threading.get_ident() in recorder.busy):
            return fn(*args, **kwargs)
        given = args[at] if 0 <= at < len(args) else kwargs.get("group")
        group = compat.functional_group(given, kwargs.get("tag", ""))
        if group is None:
            return fn(*args, **kwargs)
        return recorder.call(made, fn, args, kwargs, group=group, waited=Awaited)

    setattr(traced, _ORIGINAL, fn)
    return traced


def _wrap_wait(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``wait_tensor``, which an ``AsyncCollectiveTensor`` calls as it is first used or
    waited for, noting the wait in the record of the collective it waits for."""

    @functools.wraps(fn)
    def traced(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = None if torch.compiler.is_compiling() else current()
        awaited = recorder.awaited(tensor) if recorder is not None else None
        if awaited is None:
            return fn(tensor, *args, **kwargs)
        awaited.state = IN_FLIGHT
        try:
            done = fn(tensor, *args, **kwargs)
        except BaseException:
            awaited.state = RAISED
            raise
        awaited.state = COMPLETED
        return done

    setattr(traced, _ORIGINAL, fn)
    return traced
