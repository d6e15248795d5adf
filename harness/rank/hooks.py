"""Collectives issued below ``torch.distributed``'s functions, seen through torch's hooks.

torch >= 2.14 calls a process group's pre and post hooks around every collective it issues,
whoever issues it: DDP's reducer in C++ (its construction's all_gather and broadcasts, its
gradient all-reduces in ``backward``), functional collectives (DTensor, tensor parallelism),
compiled graphs. :func:`install` puts one pair of hooks on every group a rank has, as torch
registers it (``compat.watch_groups``), and takes them off as the group is destroyed (a
reused world's reset destroys the call's groups): one pair per live group, however many calls
the rank serves.

The hooks record into the call's :class:`~harness.rank.trace.Recorder` (between calls they
return at once): the op, its tensors, root and ``async_op``, and where the user's code was
(the innermost frame of it on the stack: for DDP's all-reduces, the line that called
``backward()``), with what it called there (``Op.origin``). A collective issued through
``torch.distributed``'s functions is recorded by their wrapper, which knows more (the reduce
op): the hooks leave the threads inside a wrapper alone, so each collective is one record.
The post hook keeps the collective's ``Work``, whose completion the trace reads: a rank blocked
in DDP's wait for its all-reduce is inside that collective. Faults placed at a collective
recorded here act in the hooks (``kill`` ``when="after"``/``"during"`` once it was issued).

A hook never raises into the user's collective, except for a fault that raises there: a
recording error becomes one warning per op, and the collective runs.

Imports: see :mod:`harness.rank`.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from harness import compat
from harness.faults import Fault
from harness.protocol.traces import COMPLETED, ISSUED, RAISED, Op
from harness.rank import sites, trace
from harness.rank.describe import tensor_text
from harness.rank.records import Record, returned

HOOK_ID = 0x68617273
"""The id the harness's hooks are registered under on each group (torch keys hooks by id:
registering it again replaces them)."""


class _Kind(NamedTuple):
    """How a collective torch names by a ``HookOpName`` is recorded.

    Attributes:
        name: The ``torch.distributed`` function it reads as.
        p2p: A point-to-point op: not numbered, never compared.
        root: How its ``root`` reads (``"src"``, ``"dst"``; '' where it has none).
        outputs: Its tensors are its outputs (``scatter``: only the root has inputs).
        shapes: Whether members agree on its shapes (not ``all_to_all``'s splits).
    """

    name: str
    p2p: bool = False
    root: str = ""
    outputs: bool = False
    shapes: bool = True


_KINDS = {
    "ALLREDUCE": _Kind("all_reduce"),
    "ALLREDUCE_COALESCED": _Kind("all_reduce_coalesced"),
    "BROADCAST": _Kind("broadcast", root="src"),
    "REDUCE": _Kind("reduce", root="dst"),
    "ALLGATHER": _Kind("all_gather"),
    "ALLGATHER_BASE": _Kind("all_gather_into_tensor"),
    "ALLGATHER_COALESCED": _Kind("all_gather_coalesced"),
    "ALLGATHER_INTO_TENSOR_COALESCED": _Kind("all_gather_into_tensor_coalesced"),
    "REDUCE_SCATTER": _Kind("reduce_scatter"),
    "REDUCE_SCATTER_BASE": _Kind("reduce_scatter_tensor"),
    "REDUCE_SCATTER_TENSOR_COALESCED": _Kind("reduce_scatter_tensor_coalesced"),
    "ALLTOALL": _Kind("all_to_all", shapes=False),
    "ALLTOALL_BASE": _Kind("all_to_all_single", shapes=False),
    "BARRIER": _Kind("barrier"),
    "SCATTER": _Kind("scatter", root="src", outputs=True),
    "GATHER": _Kind("gather", root="dst"),
    "SEND": _Kind("send", p2p=True, root="dst"),
    "RECV": _Kind("recv", p2p=True, root="src", outputs=True),
    "UNKNOWN": _Kind("collective"),
}
"""Each ``HookOpName`` recorded, by name (``SPLIT`` and ``NEW_WINDOW`` make communicators
and windows: no collective of the user's)."""

_by_member: dict[Any, _Kind | None] = {}
"""``HookOpName`` member -> its kind (None: not recorded), filled as members are first seen."""

_attached: dict[int, Any] = {}
"""``id(group)`` -> group, for each group the hooks are on."""

_pending: dict[tuple[int, int], tuple[Record, tuple[int, Fault] | None]] = {}
"""A collective between its pre and post hook (by group and torch's ``op_id``): its record,
and the fault to act out once it was issued."""

_warned: set[str] = set()
"""The ops whose recording failed, warned about once each."""

_warned_backends: set[str] = set()
"""The backends whose groups took no hooks, warned about once each."""

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_ENGINE = os.path.join(_TORCH_DIR, "autograd", "graph.py")
_GENERATED = "<eval_with_key>"  # the code of an FX graph (torch.compile's, with aot_eager)


def install() -> None:
    """Record through the hooks of every process group from now on, where torch has them.

    Once per rank, after ``leaks.note_group_sites``: groups already made get them now.
    """
    if not compat.collective_hooks_available():
        return
    compat.watch_groups(attach, detach)
    for group in compat.live_process_groups():
        attach(group)


def attach(group: Any) -> None:
    """Put the harness's hooks on ``group`` (once).

    Where torch refuses them (for Gloo, ``fake`` and backends written in Python it does
    not: the hooks are the ``ProcessGroup``'s, not its backend's), the group is recorded
    through ``torch.distributed``'s functions only, and a warning says so, once per backend.
    """
    if id(group) in _attached:
        return
    # The hooks hold the group (to find its record), and torch holds the hooks: detach()
    # breaks that cycle when torch destroys the group.
    if compat.add_collective_hooks(
        group, HOOK_ID, lambda args: _pre(group, args), lambda args: _post(group, args)
    ):
        _attached[id(group)] = group
    else:
        _unhooked(group)


def _unhooked(group: Any) -> None:
    """Warn, once per backend, that ``group``'s collectives issued below
    ``torch.distributed``'s functions go unrecorded."""
    try:
        backend = str(dist.get_backend(group))
    except Exception:  # not a registered torch ProcessGroup
        backend = type(group).__name__
    if backend in _warned_backends:
        return
    _warned_backends.add(backend)
    warnings.warn(
        f"harness: a process group of backend {backend!r} takes no collective hooks: its "
        "collectives are recorded only where issued through torch.distributed's functions "
        "(not DDP's, functional or compiled ones)",
        RuntimeWarning,
        stacklevel=2,
    )


def detach(group: Any) -> None:
    """Take the harness's hooks off ``group`` (as torch destroys it)."""
    if _attached.pop(id(group), None) is not None:
        compat.remove_collective_hooks(group, HOOK_ID)
    for key in [key for key in _pending if key[0] == id(group)]:
        del _pending[key]


def attached() -> int:
    """How many groups the hooks are on."""
    return len(_attached)


def _pre(group: Any, args: Any) -> None:
    recorder = trace.current()
    if recorder is None:
        return
    if recorder.busy and threading.get_ident() in recorder.busy:
        return  # a wrapper of torch.distributed's records it, knowing more
    placed = None
    try:
        kind = _kind(args.name)
        if kind is None:
            return
        # The frame that called into torch's C++: this hook's caller's.
        record = _note(recorder, group, kind, args, compat.frame(2))
        if record is None:
            return
        if len(_pending) > 1024:
            _pending.clear()  # posts that never came (collectives that raised): bounded
        if recorder.plan and not kind.p2p:
            placed = recorder.plan.take(record.group.ranks, record.seq)
        later = placed is not None and placed[1].kind == "kill" and placed[1].when != "before"
        _pending[(id(group), args.op_id)] = (record, placed if later else None)
        if later:
            placed = None
    except Exception as exc:
        _warn(args, exc)
        return
    if placed is not None:
        _act(recorder, record, placed, list(args.input_tensors or args.output_tensors))


def _post(group: Any, args: Any) -> None:
    if not _pending:
        return
    entry = _pending.pop((id(group), args.op_id), None)
    if entry is None:
        return
    record, placed = entry
    work = None
    try:
        work = args.work
        record.work = work
        returned(record, ISSUED if work is not None else COMPLETED)
    except Exception as exc:
        _warn(args, exc)
    recorder = trace.current()
    if placed is not None and recorder is not None:
        _act(recorder, record, placed, [], work)


def _kind(member: Any) -> _Kind | None:
    kind = _by_member.get(member, _kind)
    if kind is _kind:
        kind = _by_member[member] = _KINDS.get(getattr(member, "name", ""))
    return kind  # type: ignore[return-value]


def _note(
    recorder: trace.Recorder, group: Any, kind: _Kind, args: Any, frame: Any
) -> Record | None:
    tensors = args.output_tensors if kind.outputs else args.input_tensors
    raw = tuple((t.dtype, t.shape, t.device) for t in tensors)
    root = args.root if kind.root else -1
    place, callee, innermost = _where(frame)
    key = (kind, raw, root, args.async_op, callee, innermost)
    handle = None if group is dist.group.WORLD else group
    made = (kind, raw, root, bool(args.async_op), callee, innermost)
    return recorder.note(handle, key, kind.p2p, place, _op, *made)


def _where(frame: Any) -> tuple[tuple[str, int], Any, Any]:
    """The user's frame on the stack from ``frame`` out: its ``(file, line)``, the code it
    called (None: it called torch's C++ directly), and the code of ``frame`` itself."""
    innermost = frame.f_code if frame is not None else None
    callee = None
    while frame is not None:
        code = frame.f_code
        path = code.co_filename
        if sites.is_call_site(path) and not path.startswith(_GENERATED):
            return (path, frame.f_lineno), callee, innermost
        callee = code
        frame = frame.f_back
    return ("?", 0), None, innermost


def _op(
    kind: _Kind, raw: Any, root: int, async_op: bool, callee: Any, innermost: Any, group: Any
) -> Op:
    """How a collective recorded by the hooks reads (``group``: its handle, None: default)."""
    shown, compared, bare = [], [], []
    root_text = ""
    if root >= 0:
        if group is not None:
            try:
                root = dist.get_global_rank(group, root)
            except Exception:
                pass
        root_text = f"{kind.root}={root}"
        shown.append(root_text)
        compared.append(root_text)
    for value in raw:
        bare.append(tensor_text(value, device=False))
        shown.append(tensor_text(value))
    if kind.shapes:
        compared += bare
    else:
        compared.append("/".join(sorted({str(value[0]).removeprefix("torch.") for value in raw})))
    origin = _origin(kind, callee, innermost)
    text = f"{kind.name}({', '.join(shown)})" + (f" in {origin}" if origin else "")
    return Op(
        kind.name,
        text,
        f"{kind.name}({', '.join(compared)})",
        root=root_text,
        tensors=tuple(bare),
        device=str(raw[0][2]) if raw else "",
        p2p=kind.p2p,
        async_op=async_op,
        origin=origin,
    )


def _origin(kind: _Kind, callee: Any, innermost: Any) -> str:
    """What the user's code called that issued the collective, as a reader names it."""
    if callee is None:
        return ""
    path = callee.co_filename
    qualname = str(getattr(callee, "co_qualname", callee.co_name))
    if qualname in ("Tensor.backward", "backward") and path.startswith(_TORCH_DIR):
        # The autograd engine calling C++ with no Python between: DDP's reducer.
        from_reducer = innermost is not None and innermost.co_filename == _ENGINE
        return "backward (DDP)" if from_reducer and kind.name == "all_reduce" else "backward"
    if path.startswith(os.path.join(_TORCH_DIR, "_dynamo")):
        return "compiled code"
    if qualname.endswith("_call_impl") and innermost is not None:
        inner = getattr(innermost, "co_qualname", innermost.co_name)
        return f"{inner.partition('.')[0]} forward"
    if qualname.endswith(".__init__"):
        return f"{qualname.removesuffix('.__init__')}()"
    if path.endswith("_functional_collectives.py"):
        return f"functional {qualname}"
    return qualname


def _act(
    recorder: trace.Recorder,
    record: Record,
    placed: tuple[int, Fault],
    inputs: list[Any],
    work: Any = None,
) -> None:
    """Act out the fault ``placed`` at ``record``'s collective, from its pre hook (before
    torch issues it) or its post hook (``work``: once it was issued)."""
    plan, fault = recorder.plan, placed[1]
    assert plan is not None
    if not fault.enters:
        recorder.forget(record)
    if fault.kind == "error":
        returned(record, RAISED)
        recorder.raised = True
        group = record.group
        group.raised = group.raised or record.seq
    call = work.wait if work is not None and fault.when == "after" else _nothing
    plan.act(placed, record.op.name, call, {"input_tensor_list": inputs})


def _nothing() -> None:
    return None


def _warn(args: Any, exc: Exception) -> None:
    member = getattr(args, "name", None)
    kind = _KINDS.get(str(getattr(member, "name", "")))
    name = kind.name if kind is not None else str(member)
    if name in _warned:
        return
    _warned.add(name)
    warnings.warn(
        f"harness: could not record the {name} collective issued through torch's "
        f"process-group hooks ({exc!r}); it ran, unrecorded",
        RuntimeWarning,
        stacklevel=2,
    )
