"""Collectives issued below ``torch.distributed``'s functions, seen through torch's hooks.

torch >= 2.14 calls a process group's pre and post hooks around every collective it issues,
whoever issues it: DDP's reducer in C++ (its construction's all_gather and broadcasts, its
gradient all-reduces in ``backward``), functional collectives (DTensor, tensor parallelism),
compiled graphs. :func:`install` puts one pair of hooks on every group a rank has, as torch
registers it (``compat.watch_groups``), and takes them off as the group is destroyed (a
reused world's reset destroys the call's groups): one pair per live group, however many calls
the rank serves.

The hooks record into the call's :class:`~harness.rank.recording.recorder.Recorder` (between
calls they return at once): the op, its tensors, root and ``async_op``, and where the user's
code was (the innermost frame of it on the stack: for DDP's all-reduces, the line that
called ``backward()``), with what it called there (``Op.origin``). A collective issued
through ``torch.distributed``'s functions is recorded by their wrapper, which knows more
(the reduce op): the hooks leave the threads inside a wrapper alone, so each collective is
one record. The post hook keeps the collective's ``Work``, whose completion the trace reads:
a rank blocked in DDP's wait for its all-reduce is inside that collective. Faults placed at
a collective recorded here act in the hooks (``kill`` ``when="after"``/``"during"`` once it
was issued). A collective torch raised while issuing it (its post hook never runs: the
record holds an ``Issuing`` marker) reads raised once its thread left the frame that issued
it, and one whose ``Work`` failed reads raised too (:mod:`harness.rank.recording.records`).

A hook never raises into the user's collective, except for a fault that raises there: a
recording error becomes one warning per op, and the collective runs.

Imports: see :mod:`harness.rank`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from threading import get_ident
from typing import Any

import torch.distributed as dist

from harness import compat
from harness.faults import Fault
from harness.protocol.traces import COMPLETED, ISSUED
from harness.rank import sites
from harness.rank.recording import hook_ops
from harness.rank.recording.recorder import Recorder, current
from harness.rank.recording.records import Issuing, Record, failed, returned

HOOK_ID = 0x68617273
"""The id the harness's hooks are registered under on each group (torch keys hooks by id:
registering it again replaces them)."""


@dataclass
class _Hooks:
    """The hooks' state in a rank (:func:`install` makes it, :func:`uninstall` drops it).

    Attributes:
        attached: ``id(group)`` -> group, for each group the hooks are on.
        issuing: Per thread, the collective between its pre and post hook (torch calls both
            on the thread that issues it): its group, its record, and the fault to act out
            once it was issued. One whose post hook never came raised below the hooks.
        kinds: A ``HookOpName``'s value -> its kind (None: not recorded), filled as first seen.
        user_code: ``id(code)`` -> ``(code, whether its frames are the user's)``, filled as
            first seen (the code is held, so that its id stays its own).
        origins: ``(op, id(callee), id(innermost))`` -> ``(callee, innermost, origin)``.
        warned: The ops whose recording failed, warned about once each.
        warned_backends: The backends whose groups took no hooks, warned about once each.
    """

    attached: dict[int, Any] = field(default_factory=dict)
    issuing: dict[int, tuple[Any, Record, tuple[int, Fault] | None]] = field(default_factory=dict)
    kinds: dict[int, hook_ops.Kind | None] = field(default_factory=dict)
    user_code: dict[int, tuple[Any, bool]] = field(default_factory=dict)
    origins: dict[tuple[str, int, int], tuple[Any, Any, str]] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    warned_backends: set[str] = field(default_factory=set)


_hooks: _Hooks | None = None
"""The rank's hooks' state (None: not installed). Module-level: torch calls the hooks with
its own arguments only."""

_CACHED = 4096
"""How many code objects (and pairs of them) a cache holds before it starts over: code made
at run time (compiled graphs) comes and goes."""

_GENERATED = "<eval_with_key>"  # the code of an FX graph (torch.compile's, with aot_eager)


def install() -> None:
    """Record through the hooks of every process group from now on, where torch has them.

    Once per rank, after ``leaks.note_group_sites``: groups already made get them now.
    """
    if not compat.collective_hooks_available():
        return
    _held()
    compat.watch_groups(attach, detach)
    for group in compat.live_process_groups():
        attach(group)


def uninstall() -> None:
    """Take the hooks off every group, stop putting them on new ones, and drop their state."""
    global _hooks
    if _hooks is None:
        return
    compat.watch_groups(_ignored, _ignored)
    for group in list(_hooks.attached.values()):
        detach(group)
    _hooks = None


def record_only() -> None:
    """Put no hooks on any group from now on, and keep what :func:`note_below` needs: in a
    process whose groups see their own collectives and record them through it."""
    uninstall()
    _held()


def _ignored(group: Any) -> None:
    return None


def _held() -> _Hooks:
    global _hooks
    if _hooks is None:
        _hooks = _Hooks()
    return _hooks


def attach(group: Any) -> None:
    """Put the harness's hooks on ``group`` (once).

    Where torch refuses them (for Gloo, ``fake`` and backends written in Python it does
    not: the hooks are the ``ProcessGroup``'s, not its backend's), the group is recorded
    through ``torch.distributed``'s functions only, and a warning says so, once per backend.
    """
    state = _held()
    if id(group) in state.attached:
        return
    # The hooks hold the group (to find its record), and torch holds the hooks: detach()
    # breaks that cycle when torch destroys the group.
    if compat.add_collective_hooks(
        group, HOOK_ID, lambda args: _pre(group, args), lambda args: _post(group, args)
    ):
        state.attached[id(group)] = group
    else:
        _unhooked(state, group)


def _unhooked(state: _Hooks, group: Any) -> None:
    """Warn, once per backend, that ``group``'s collectives issued below
    ``torch.distributed``'s functions go unrecorded."""
    try:
        backend = str(dist.get_backend(group))
    except Exception:  # not a registered torch ProcessGroup
        backend = type(group).__name__
    if backend in state.warned_backends:
        return
    state.warned_backends.add(backend)
    warnings.warn(
        f"harness: a process group of backend {backend!r} takes no collective hooks: its "
        "collectives are recorded only where issued through torch.distributed's functions "
        "(not DDP's, functional or compiled ones)",
        RuntimeWarning,
        stacklevel=3,
    )


def detach(group: Any) -> None:
    """Take the harness's hooks off ``group`` (as torch destroys it)."""
    state = _hooks
    if state is None:
        return
    if state.attached.pop(id(group), None) is not None:
        compat.remove_collective_hooks(group, HOOK_ID)
    for thread in [thread for thread, entry in state.issuing.items() if entry[0] is group]:
        del state.issuing[thread]


def attached() -> int:
    """How many groups the hooks are on."""
    return len(_hooks.attached) if _hooks is not None else 0


def _pre(group: Any, args: Any) -> None:
    recorder = current()
    state = _hooks
    if recorder is None or state is None:
        return
    thread = get_ident()
    issuing = state.issuing
    if issuing:
        earlier = issuing.pop(thread, None)
        if earlier is not None:
            # Its post hook never came: torch raised, and the user's code went on.
            _raised(recorder, earlier[1])
    if recorder.busy and thread in recorder.busy:
        return  # a wrapper of torch.distributed's records it, knowing more
    placed = None
    try:
        member = args.name
        kinds, value = state.kinds, member.value
        kind = kinds[value] if value in kinds else kinds.setdefault(value, hook_ops.kind_of(member))
        if kind is None:
            return
        # The frame that called into torch's C++: this hook's caller's.
        frame = compat.frame(2)
        tensors = args.output_tensors if kind.outputs else args.input_tensors
        root = args.root if kind.root else -1
        record = note_below(recorder, group, kind, tensors, root, bool(args.async_op), frame)
        if record is None:
            return
        record.work = Issuing(frame, thread)
        if recorder.plan and not kind.p2p:
            placed = recorder.plan.take(record)
        later = placed is not None and placed[1].kind == "kill" and placed[1].when != "before"
        # torch calls the post hook on this thread, once it issued the collective.
        issuing[thread] = (group, record, placed if later else None)
        if later:
            placed = None
    except Exception as exc:
        _warn(args, exc)
        return
    if recorder.holds is not None:
        recorder.holds.before(record)
    if placed is not None:
        _act(recorder, record, placed, list(args.input_tensors or args.output_tensors))


def _raised(recorder: Recorder, record: Record) -> None:
    """Note that torch raised ``record``'s collective while issuing it."""
    if isinstance(record.work, Issuing):
        record.work = None
        failed(record)
        recorder.raised = True
        if recorder.holds is not None:
            recorder.holds.raised(record)


def _post(group: Any, args: Any) -> None:
    state = _hooks
    if state is None or not state.issuing:
        return
    thread = get_ident()
    entry = state.issuing.get(thread)
    if entry is None or entry[0] is not group:
        return  # a collective its pre hook left to a wrapper, or did not record
    del state.issuing[thread]
    record, placed = entry[1], entry[2]
    work = None
    try:
        work = args.work
        record.work = work
        returned(record, ISSUED if work is not None else COMPLETED)
    except Exception as exc:
        record.work = None
        _warn(args, exc)
    recorder = current()
    if recorder is not None and recorder.holds is not None:
        recorder.holds.after(record, work)
    if placed is not None and recorder is not None:
        _act(recorder, record, placed, [], work)


def note_below(
    recorder: Recorder,
    group: Any,
    kind: hook_ops.Kind,
    tensors: Any,
    root: int,
    async_op: bool,
    frame: Any,
) -> Record | None:
    """Record a collective torch issues below ``torch.distributed``'s functions, as the hooks
    read it: what the pre hook calls, and what a process group that sees its own
    collectives calls where the hooks record nothing (:func:`record_only`).

    Args:
        recorder: The call's recorder.
        group: The collective's process group.
        kind: How it is recorded.
        tensors: Its tensors, as the hooks give them (its outputs where ``kind.outputs``).
        root: Its root in the group (-1: none).
        async_op: Whether it was issued without waiting.
        frame: The frame that called into torch's C++.
    """
    if len(tensors) == 1:  # the usual case, without a comprehension's call
        tensor = tensors[0]
        raw: tuple[Any, ...] = ((tensor.dtype, tensor.shape, tensor.device),)
    else:
        raw = tuple([(t.dtype, t.shape, t.device) for t in tensors])
    place, origin = _where(kind, frame)
    key = (kind.name, raw, root, async_op, origin)
    # The recorder reads the default group's handle (group.WORLD) as None itself.
    return recorder.note(
        group, key, kind.p2p, place, hook_ops.op, kind, raw, root, async_op, origin
    )


def _where(kind: hook_ops.Kind, frame: Any) -> tuple[tuple[str, int], str]:
    """The user's frame on the stack from ``frame`` out, as its ``(file, line)``, and what
    it called that issued the collective (:func:`hook_ops.origin`, cached per pair of code
    objects)."""
    assert _hooks is not None
    user_code = _hooks.user_code
    innermost = frame.f_code if frame is not None else None
    callee = None
    while frame is not None:
        code = frame.f_code
        found = user_code.get(id(code))
        if found is None or found[0] is not code:
            if len(user_code) > _CACHED:
                user_code.clear()
            path = code.co_filename
            found = user_code[id(code)] = (
                code,
                sites.is_call_site(path) and not path.startswith(_GENERATED),
            )
        if found[1]:
            break
        callee = code
        frame = frame.f_back
    else:
        return ("?", 0), ""
    place = (code.co_filename, frame.f_lineno)
    if callee is None:
        return place, ""
    origins = _hooks.origins
    key = (kind.name, id(callee), id(innermost))
    known = origins.get(key)
    if known is None or known[0] is not callee or known[1] is not innermost:
        if len(origins) > _CACHED:
            origins.clear()
        known = origins[key] = (callee, innermost, hook_ops.origin(kind, callee, innermost))
    return place, known[2]


def _act(
    recorder: Recorder,
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
        record.work = None  # no collective of the user's raised there
    if fault.kind == "error":
        failed(record)
        recorder.raised = True
    call = work.wait if work is not None and fault.when == "after" else _nothing
    plan.act(placed, record, call, {"input_tensor_list": inputs})


def _nothing() -> None:
    return None


def _warn(args: Any, exc: Exception) -> None:
    member = getattr(args, "name", None)
    kind = hook_ops.KINDS.get(str(getattr(member, "name", "")))
    name = kind.name if kind is not None else str(member)
    warned = _held().warned
    if name in warned:
        return
    warned.add(name)
    warnings.warn(
        f"harness: could not record the {name} collective issued through torch's "
        f"process-group hooks ({exc!r}); it ran, unrecorded",
        RuntimeWarning,
        stacklevel=2,
    )
