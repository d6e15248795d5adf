"""How one call of a recorded ``torch.distributed`` function reads: its :class:`Op`. This
module runs INSIDE each rank; :mod:`harness.rank.trace` records the calls and uses it.

Each recorded function has a row in :data:`_COLLECTIVES` or :data:`_P2P`: the arguments that
describe a call (:class:`Arg`), each of a kind (a tensor, a reduce op, a root...). A kind is
read twice, by a pair of functions in :data:`_KINDS`:

* ``raw``, on every call: a hashable description, cheap to make (nothing is formatted: a
  tensor is its dtype, ``torch.Size`` and device, all hashed by identity or value), which the
  recorder looks up in its per-call table of distinct ops;
* ``text``, once per distinct op and call: how it reads in ``Op.text`` and what of it goes
  into ``Op.key`` (what must be equal on every member rank).

Where each argument is in a function's parameters is read from its signature (:func:`spec`),
which differs between torch releases (``group_src`` is new in 2.6).

It may import the stdlib, torch and the protocol (:mod:`harness.protocol.traces`) only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import torch.distributed as dist

from harness.protocol.traces import Op


class Arg(NamedTuple):
    """One argument that describes a call.

    Attributes:
        param: The parameter's name.
        kind: What it is, a key of :data:`_KINDS`: ``"tensor"``, ``"tensors"`` (a list),
            ``"dtypes"`` (of a tensor or a list: only their dtypes), ``"objects"`` (a list:
            its length), ``"op"`` (a reduce op), ``"root"`` (a global rank: src/dst),
            ``"group_root"`` (a rank in the group: group_src/group_dst), ``"p2p"``
            (batch_isend_irecv's list of P2POp).
        shown: Whether it is part of ``Op.text``.
        compared: Whether it is part of ``Op.key``, what must be equal on every member rank
            (never for a point-to-point op: those are not compared across ranks).
    """

    param: str
    kind: str
    shown: bool = True
    compared: bool = True


_T, _L = "tensor", "tensors"
_SRC = (Arg("src", "root"), Arg("group_src", "group_root"))
_DST = (Arg("dst", "root"), Arg("group_dst", "group_root"))

_COLLECTIVES: dict[str, tuple[Arg, ...]] = {
    "all_reduce": (Arg("op", "op"), Arg("tensor", _T)),
    "all_reduce_coalesced": (Arg("op", "op"), Arg("tensors", _L)),
    "broadcast": (*_SRC, Arg("tensor", _T)),
    "reduce": (*_DST, Arg("op", "op"), Arg("tensor", _T)),
    # all_gather's inputs may differ in size by rank where the backend allows it; the list
    # of outputs is the same on every rank.
    "all_gather": (Arg("tensor", _T, compared=False), Arg("tensor_list", _L, shown=False)),
    "all_gather_into_tensor": (Arg("output_tensor", _T), Arg("input_tensor", _T)),
    "all_gather_single": (Arg("output_tensor", _T), Arg("input_tensor", _T)),
    "all_gather_coalesced": (Arg("input_tensor_list", _L),),
    # gather_list / scatter_list exist on the root only.
    "gather": (*_DST, Arg("tensor", _T)),
    "scatter": (*_SRC, Arg("tensor", _T)),
    "reduce_scatter": (Arg("op", "op"), Arg("output", _T), Arg("input_list", _L)),
    "reduce_scatter_tensor": (Arg("op", "op"), Arg("output", _T), Arg("input", _T)),
    "reduce_scatter_single": (Arg("op", "op"), Arg("output", _T), Arg("input", _T)),
    # Split sizes differ by rank: only the dtype and the number of chunks must agree.
    "all_to_all": (
        Arg("input_tensor_list", _L, compared=False),
        Arg("input_tensor_list", "dtypes", shown=False),
    ),
    "all_to_all_single": (Arg("input", _T, compared=False), Arg("input", "dtypes", shown=False)),
    "barrier": (),
    "monitored_barrier": (),
    "broadcast_object_list": (*_SRC, Arg("object_list", "objects")),
    "all_gather_object": (Arg("object_list", "objects"),),
    "gather_object": _DST,
    "scatter_object_list": _SRC,
}
"""The collectives recorded, and the arguments that describe a call of each."""

_P2P: dict[str, tuple[Arg, ...]] = {
    "send": (*_DST, Arg("tensor", _T)),
    "recv": (*_SRC, Arg("tensor", _T)),
    "isend": (*_DST, Arg("tensor", _T)),
    "irecv": (*_SRC, Arg("tensor", _T)),
    "send_object_list": (*_DST, Arg("object_list", "objects")),
    "recv_object_list": (*_SRC, Arg("object_list", "objects")),
    "batch_isend_irecv": (Arg("p2p_op_list", "p2p"),),
}
"""The point-to-point ops recorded: not numbered among a group's collectives, nor compared."""

TRACED = (*_COLLECTIVES, *_P2P)
"""The functions of ``torch.distributed`` that are recorded (those this torch has)."""


class _Facts:
    """What the ``text`` functions gather for an :class:`Op` besides its text and key."""

    __slots__ = ("device", "reduce_op", "root", "tensors")

    def __init__(self) -> None:
        self.reduce_op = self.root = self.device = ""
        self.tensors: list[str] = []


# ------------------------------------------------------------------- the kinds: raw, text
# ``raw(value)`` is never given None (an argument left at None is not described);
# ``text(value, param, group, facts)`` returns (how it reads, what of it is compared).


def _raw_tensor(t: Any) -> tuple[Any, Any, Any]:
    return (t.dtype, t.shape, t.device)


def _raw_tensors(value: Any) -> tuple[Any, ...]:
    return tuple((t.dtype, t.shape, t.device) for t in value)


def _raw_dtypes(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(t.dtype for t in value)
    return value.dtype


def _raw_length(value: Any) -> int:
    return len(value)


def _raw_as_is(value: Any) -> Any:
    return value  # a root: an int


_REDUCE_NAMES: dict[int, tuple[Any, str]] = {}
"""``id(op) -> (op, name)`` of the reduce ops seen (the op is held so its id stays its own)."""


def _raw_reduce_op(op: Any) -> str:
    # A ReduceOp hashes and compares through pybind (about 1 us each): its name, cached by
    # identity, is what the op table is keyed by.
    cached = _REDUCE_NAMES.get(id(op))
    if cached is not None and cached[0] is op:
        return cached[1]
    if len(_REDUCE_NAMES) > 64:
        _REDUCE_NAMES.clear()  # ReduceOp objects made per call (premul_sum): bounded
    name = reduce_name(op)
    _REDUCE_NAMES[id(op)] = (op, name)
    return name


def _raw_p2p(value: Any) -> tuple[Any, ...]:
    return tuple(
        (
            getattr(p.op, "__name__", "?"),
            p.peer,
            getattr(p, "group_peer", None),
            (p.tensor.dtype, p.tensor.shape, p.tensor.device),
        )
        for p in value
    )


def _text_tensor(value: Any, param: str, group: Any, facts: _Facts) -> tuple[str, str]:
    # The key leaves the device out: cuda:0 on rank 0 against cuda:1 on rank 1 is right.
    bare = tensor_text(value, device=False)
    facts.tensors.append(bare)
    facts.device = facts.device or str(value[2])
    return tensor_text(value), bare


def _text_tensors(value: Any, param: str, group: Any, facts: _Facts) -> tuple[str, str]:
    bare = [tensor_text(t, device=False) for t in value]
    facts.tensors += bare
    facts.device = facts.device or (str(value[0][2]) if value else "")
    text = "[" + ", ".join(tensor_text(t) for t in value) + "]"
    return text, "[" + ", ".join(bare) + "]"


def _text_dtypes(value: Any, param: str, group: Any, facts: _Facts) -> tuple[str, str]:
    if isinstance(value, tuple):
        text = f"{len(value)} x {'/'.join(sorted({dtype_text(d) for d in value}))}"
    else:
        text = dtype_text(value)
    return text, text


def _text_objects(value: Any, param: str, group: Any, facts: _Facts) -> tuple[str, str]:
    text = f"{value} object" + ("" if value == 1 else "s")
    return text, text


def _text_reduce_op(value: Any, param: str, group: Any, facts: _Facts) -> tuple[str, str]:
    facts.reduce_op = value  # its raw form is its name already
    return value, value


def _text_root(value: Any, param: str, group: Any, facts: _Facts) -> tuple[str, str]:
    facts.root = f"{param}={value}"
    return facts.root, facts.root


def _text_group_root(value: Any, param: str, group: Any, facts: _Facts) -> tuple[str, str]:
    # Shown as the global rank it is, like src/dst.
    try:
        facts.root = f"{param.removeprefix('group_')}={dist.get_global_rank(group, value)}"
    except Exception:
        facts.root = f"{param}={value}"
    return facts.root, facts.root


def _text_p2p(value: Any, param: str, group: Any, facts: _Facts) -> tuple[str, str]:
    text = ", ".join(
        f"{name}({'dst' if name == 'isend' else 'src'}="
        f"{peer if peer is not None else group_peer}, {tensor_text(t)})"
        for name, peer, group_peer, t in value
    )
    return text, text


class _Kind(NamedTuple):
    raw: Callable[[Any], Any]
    text: Callable[[Any, str, Any, _Facts], tuple[str, str]]


_KINDS: dict[str, _Kind] = {
    "tensor": _Kind(_raw_tensor, _text_tensor),
    "tensors": _Kind(_raw_tensors, _text_tensors),
    "dtypes": _Kind(_raw_dtypes, _text_dtypes),
    "objects": _Kind(_raw_length, _text_objects),
    "op": _Kind(_raw_reduce_op, _text_reduce_op),
    "root": _Kind(_raw_as_is, _text_root),
    "group_root": _Kind(_raw_as_is, _text_group_root),
    "p2p": _Kind(_raw_p2p, _text_p2p),
}
"""How each kind of argument is read (see the module's docstring)."""


# ------------------------------------------------------------------------- one function


class Param(NamedTuple):
    """Where one described argument is in a function's parameters, and how it reads."""

    position: int
    name: str
    default: Any
    raw: Callable[[Any], Any]
    text: Callable[[Any, str, Any, _Facts], tuple[str, str]]
    shown: bool
    compared: bool


class Spec(NamedTuple):
    """How to record one function.

    Attributes:
        name: The function's name.
        p2p: A point-to-point op (see :data:`_P2P`).
        params: Its described arguments, in the order they read.
        group_at: The position of its ``group`` parameter (-1: none).
    """

    name: str
    p2p: bool
    params: tuple[Param, ...]
    group_at: int


def spec(name: str, fn: Callable[..., Any]) -> Spec:
    """How to record ``fn``, the function of ``torch.distributed`` named ``name`` (one of
    :data:`TRACED`), from its signature."""
    signature = list(inspect.signature(fn).parameters.values())
    position = {p.name: i for i, p in enumerate(signature)}
    p2p = name in _P2P
    params = []
    for arg in (_P2P if p2p else _COLLECTIVES)[name]:
        if arg.param not in position:
            continue
        default = signature[position[arg.param]].default
        default = None if default is inspect.Parameter.empty else default
        kind = _KINDS[arg.kind]
        compared = arg.compared and not p2p
        params.append(Param(position[arg.param], arg.param, default, *kind, arg.shown, compared))
    return Spec(name, p2p, tuple(params), position.get("group", -1))


def raw(spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A hashable description of a call's arguments, cheap to make: nothing is formatted."""
    given = len(args)
    described = []
    for p in spec.params:
        value = args[p.position] if p.position < given else kwargs.get(p.name, p.default)
        described.append(None if value is None else p.raw(value))
    return tuple(described)


def op(spec: Spec, described: tuple[Any, ...], group: Any) -> Op:
    """What a call reads as, from its raw description (see :func:`raw`); ``group`` is the
    call's process group (a group rank is shown as the global rank it is)."""
    facts = _Facts()
    shown: list[str] = []
    key: list[str] = []
    for param, value in zip(spec.params, described, strict=True):
        if value is None:
            continue
        text, compared = param.text(value, param.name, group, facts)
        if param.shown:
            shown.append(text)
        if param.compared:
            key.append(compared)
    return Op(
        spec.name,
        f"{spec.name}({', '.join(shown)})",
        f"{spec.name}({', '.join(key)})",
        facts.reduce_op,
        facts.root,
        tuple(facts.tensors),
        facts.device,
        spec.p2p,
    )


def dtype_text(dtype: Any) -> str:
    """``"float32"`` for ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


def tensor_text(value: tuple[Any, Any, Any], device: bool = True) -> str:
    """``"float32[2, 3]"`` for a raw tensor ``(dtype, shape, device)``; with ``device``, a
    tensor off the CPU names its device (``"float32[4] cuda:0"``)."""
    dtype, shape, where = value
    text = f"{dtype_text(dtype)}[{', '.join(map(str, shape))}]"
    if device and str(where) != "cpu":
        text += f" {where}"
    return text


def reduce_name(op: Any) -> str:
    """``"SUM"`` for ``ReduceOp.SUM`` (a ``RedOpType``) or a ``ReduceOp`` wrapping one."""
    name = getattr(op, "name", None)
    if isinstance(name, str):
        return name
    inner = getattr(op, "op", None)
    name = getattr(inner, "name", None)
    return name if isinstance(name, str) else str(op)
