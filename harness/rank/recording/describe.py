"""How a recorded ``torch.distributed`` call reads, for the trace.

Each call reads as its :class:`Op`.

Each recorded function has a row in :data:`_COLLECTIVES` or :data:`_P2P`: the arguments that
describe a call, each of an :class:`ArgKind`. Where each one is in the function's parameters is
read from its signature (:func:`spec`), which differs between torch releases
(``group_src`` is new in 2.6).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import torch.distributed as dist

from harness.protocol.traces import Op


class _Facts:
    """What the ``text`` functions gather for an :class:`Op`.

    That is, besides its text and key.
    """

    __slots__ = ("async_op", "device", "group", "reduce_op", "root", "tensors")

    def __init__(self, group: Any) -> None:
        self.group = group  # the call's process group: a rank in it reads as its global rank
        self.reduce_op = self.root = self.device = ""
        self.tensors: list[str] = []
        self.async_op = False


class ArgKind(NamedTuple):
    """How one kind of argument reads.

    Kinds are a tensor, a reduce op, a root...

    Attributes:
        raw: On every call: a hashable description of the value (never None) that formats
            nothing (a tensor is its dtype, ``torch.Size`` and device), for the recorder's
            table of distinct ops.
        text: Once per distinct op and call, ``text(raw, param, facts)``: how it reads in
            ``Op.text``, and what of it goes into ``Op.key``.
    """

    raw: Callable[[Any], Any]
    text: Callable[[Any, str, _Facts], tuple[str, str]]


def _raw_tensor(t: Any) -> tuple[Any, Any, Any]:
    return (t.dtype, t.shape, t.device)


def tensor_text(value: tuple[Any, Any, Any], device: bool = True) -> str:
    """How a raw tensor reads, as ``"float32[2, 3]"``.

    With ``device``, a tensor off the CPU names its device (``"float32[4] cuda:0"``).
    """
    dtype, shape, where = value
    text = f"{str(dtype).removeprefix('torch.')}[{', '.join(map(str, shape))}]"
    return f"{text} {where}" if device and str(where) != "cpu" else text


def _text_tensor(value: Any, param: str, facts: _Facts) -> tuple[str, str]:
    # The key leaves the device out: cuda:0 on rank 0 against cuda:1 on rank 1 is right.
    bare = tensor_text(value, device=False)
    facts.tensors.append(bare)
    facts.device = facts.device or str(value[2])
    return tensor_text(value), bare


def _text_tensors(value: Any, param: str, facts: _Facts) -> tuple[str, str]:
    pairs = [_text_tensor(t, param, facts) for t in value]
    return f"[{', '.join(t for t, _ in pairs)}]", f"[{', '.join(k for _, k in pairs)}]"


def _raw_dtypes(value: Any) -> Any:
    return tuple(t.dtype for t in value) if isinstance(value, (list, tuple)) else value.dtype


def _text_dtypes(value: Any, param: str, facts: _Facts) -> tuple[str, str]:
    names = {
        str(d).removeprefix("torch.") for d in (value if isinstance(value, tuple) else [value])
    }
    text = f"{len(value)} x {'/'.join(sorted(names))}" if isinstance(value, tuple) else names.pop()
    return text, text


def _text_objects(value: Any, param: str, facts: _Facts) -> tuple[str, str]:
    text = f"{value} object" + ("" if value == 1 else "s")
    return text, text


_REDUCE_NAMES: dict[int, tuple[Any, str]] = {}
"""``id(op) -> (op, name)`` of the reduce ops seen (the op is held so its id stays its own)."""


def _raw_reduce_op(op: Any) -> str:
    # A ReduceOp hashes and compares through pybind, slowly: its name, cached by identity,
    # is what the op table is keyed by.
    cached = _REDUCE_NAMES.get(id(op))
    if cached is not None and cached[0] is op:
        return cached[1]
    if len(_REDUCE_NAMES) > 64:
        _REDUCE_NAMES.clear()  # ReduceOp objects made per call (premul_sum): bounded
    name = getattr(op, "name", None)  # a RedOpType's, else that of the one a ReduceOp wraps
    if not isinstance(name, str):
        name = getattr(getattr(op, "op", None), "name", None)
    name = name if isinstance(name, str) else str(op)
    _REDUCE_NAMES[id(op)] = (op, name)
    return name


def _text_reduce_op(value: Any, param: str, facts: _Facts) -> tuple[str, str]:
    facts.reduce_op = value  # its raw form is its name already
    return value, value


def _text_root(value: Any, param: str, facts: _Facts) -> tuple[str, str]:
    if param.startswith("group_"):  # group_src/group_dst: shown as the global rank it is
        try:
            # On the default group (no handle: None) a group rank is its global rank, so
            # group_src=1 there reads as src=1 does on a peer that named it so.
            if facts.group is not None:
                value = dist.get_global_rank(facts.group, value)
            param = param[len("group_") :]
        except Exception:
            pass
    facts.root = f"{param}={value}"
    return facts.root, facts.root


def _raw_p2p(value: Any) -> tuple[Any, ...]:
    return tuple(
        (
            getattr(o.op, "__name__", "?"),
            o.peer,
            getattr(o, "group_peer", None),
            _raw_tensor(o.tensor),
        )
        for o in value
    )


def _text_p2p(value: Any, param: str, facts: _Facts) -> tuple[str, str]:
    text = ", ".join(
        f"{name}({'dst' if name == 'isend' else 'src'}="
        f"{peer if peer is not None else group_peer}, {tensor_text(t)})"
        for name, peer, group_peer, t in value
    )
    return text, text


def _text_async(value: Any, param: str, facts: _Facts) -> tuple[str, str]:
    facts.async_op = bool(value)
    return "", ""


TENSOR = ArgKind(_raw_tensor, _text_tensor)
TENSORS = ArgKind(lambda value: tuple(map(_raw_tensor, value)), _text_tensors)
DTYPES = ArgKind(_raw_dtypes, _text_dtypes)  # of a tensor or a list: only their dtypes
OBJECTS = ArgKind(len, _text_objects)  # a list: its length
REDUCE_OP = ArgKind(_raw_reduce_op, _text_reduce_op)
ROOT = ArgKind(lambda value: value, _text_root)  # src/dst, or group_src/group_dst in the group
P2P = ArgKind(_raw_p2p, _text_p2p)  # batch_isend_irecv's list of P2POp
ASYNC = ArgKind(bool, _text_async)  # async_op: neither shown nor compared


class OpArg(NamedTuple):
    """One argument that describes a call.

    It holds its parameter, its kind, whether it is shown (in ``Op.text``) and compared (in
    ``Op.key``, what must be equal on every member rank; never for a point-to-point op).
    """

    param: str
    kind: ArgKind
    shown: bool = True
    compared: bool = True


_ASYNC_ARG = OpArg("async_op", ASYNC, shown=False, compared=False)
_SRC = (OpArg("src", ROOT), OpArg("group_src", ROOT))
_DST = (OpArg("dst", ROOT), OpArg("group_dst", ROOT))
_OP = OpArg("op", REDUCE_OP)

# What is compared is only what must agree on every member for the collective to be right;
# what each rank may size or lay out for itself is shown, never compared.
_COLLECTIVES: dict[str, tuple[OpArg, ...]] = {
    "all_reduce": (_OP, OpArg("tensor", TENSOR)),
    "all_reduce_coalesced": (_OP, OpArg("tensors", TENSORS)),
    "broadcast": (*_SRC, OpArg("tensor", TENSOR)),
    "reduce": (*_DST, _OP, OpArg("tensor", TENSOR)),
    # all_gather's inputs may differ in size by rank where the backend allows it; the list
    # of outputs is the same on every rank.
    "all_gather": (
        OpArg("tensor", TENSOR, compared=False),
        OpArg("tensor_list", TENSORS, shown=False),
    ),
    # The output may be the inputs concatenated or stacked, each rank's choice (a size
    # other than the group's times the input's raises on that rank alone); the input is
    # the same size on every rank.
    "all_gather_into_tensor": (
        OpArg("output_tensor", TENSOR, compared=False),
        OpArg("input_tensor", TENSOR),
    ),
    "all_gather_single": (
        OpArg("output_tensor", TENSOR, compared=False),
        OpArg("input_tensor", TENSOR),
    ),
    "all_gather_coalesced": (OpArg("input_tensor_list", TENSORS),),
    # gather_list / scatter_list exist on the root only.
    "gather": (*_DST, OpArg("tensor", TENSOR)),
    "scatter": (*_SRC, OpArg("tensor", TENSOR)),
    # Each rank's output is the size of its own entry of the input list, which may differ
    # by rank where the backend allows it (Gloo does); the list is the same on every rank.
    "reduce_scatter": (_OP, OpArg("output", TENSOR, compared=False), OpArg("input_list", TENSORS)),
    # The reverse of all_gather_into_tensor: the input may be the outputs concatenated or
    # stacked, each rank's choice; the output is the same size on every rank.
    "reduce_scatter_tensor": (_OP, OpArg("output", TENSOR), OpArg("input", TENSOR, compared=False)),
    "reduce_scatter_single": (_OP, OpArg("output", TENSOR), OpArg("input", TENSOR, compared=False)),
    # Split sizes differ by rank: only the dtype and the number of chunks must agree.
    "all_to_all": (
        OpArg("input_tensor_list", TENSORS, compared=False),
        OpArg("input_tensor_list", DTYPES, shown=False),
    ),
    "all_to_all_single": (
        OpArg("input", TENSOR, compared=False),
        OpArg("input", DTYPES, shown=False),
    ),
    "barrier": (),
    "monitored_barrier": (),
    "broadcast_object_list": (*_SRC, OpArg("object_list", OBJECTS)),
    "all_gather_object": (OpArg("object_list", OBJECTS),),
    "gather_object": _DST,
    "scatter_object_list": _SRC,
}
"""The collectives recorded, and the arguments that describe a call of each."""

_ROOT_ZERO = frozenset(
    {"gather", "scatter", "gather_object", "scatter_object_list", "broadcast_object_list"}
)
"""The collectives whose root is global rank 0 where a call names none: torch >= 2.6 reads
that from ``src=None``, ``group_src=None`` (older ones have ``src=0`` in the signature), so
a rank that names ``dst=0`` and one that names no root call the same collective."""

_P2P: dict[str, tuple[OpArg, ...]] = {
    "send": (*_DST, OpArg("tensor", TENSOR)),
    "recv": (*_SRC, OpArg("tensor", TENSOR)),
    "isend": (*_DST, OpArg("tensor", TENSOR)),
    "irecv": (*_SRC, OpArg("tensor", TENSOR)),
    "send_object_list": (*_DST, OpArg("object_list", OBJECTS)),
    "recv_object_list": (*_SRC, OpArg("object_list", OBJECTS)),
    "batch_isend_irecv": (OpArg("p2p_op_list", P2P),),
}
"""The point-to-point ops recorded: not numbered among a group's collectives, nor compared."""

TRACED = (*_COLLECTIVES, *_P2P)
"""The functions of ``torch.distributed`` that are recorded (those this torch has)."""


class Spec(NamedTuple):
    """How to record one function.

    It holds its name, whether it is point-to-point, its described arguments (each with its
    position and default) in the order they read, and the position of its ``group`` parameter
    (-1: none).
    """

    name: str
    p2p: bool
    params: tuple[tuple[int, Any, OpArg], ...]
    group_at: int


def spec(name: str, fn: Callable[..., Any], described: tuple[OpArg, ...] | None = None) -> Spec:
    """How to record ``fn``, from its signature.

    ``fn`` is the function of ``torch.distributed`` named ``name`` (one of :data:`TRACED`),
    or another that reads as ``name`` with the arguments ``described`` (a functional
    collective: :mod:`harness.rank.recording.functional`).
    """
    signature = list(inspect.signature(fn).parameters.values())
    position = {p.name: i for i, p in enumerate(signature)}
    p2p = name in _P2P
    if described is None:
        described = (_P2P if p2p else _COLLECTIVES)[name]
    params = []
    for arg in (*described, _ASYNC_ARG):
        if arg.param in position:
            default = signature[position[arg.param]].default
            default = None if default is inspect.Parameter.empty else default
            params.append(
                (position[arg.param], default, arg._replace(compared=arg.compared and not p2p))
            )
    return Spec(name, p2p, tuple(params), position.get("group", -1))


def raw(spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A hashable description of a call's arguments.

    It is cheap to make: nothing is formatted.
    """
    given = len(args)
    described = []
    for at, default, arg in spec.params:
        value = args[at] if at < given else kwargs.get(arg.param, default)
        described.append(None if value is None else arg.kind.raw(value))
    return tuple(described)


def op(spec: Spec, described: tuple[Any, ...], group: Any) -> Op:
    """What a call reads as, from its :func:`raw` description.

    ``group`` is its process group.
    """
    facts = _Facts(group)
    shown: list[str] = []
    key: list[str] = []
    if spec.name in _ROOT_ZERO:
        described = _root_zero(spec, described)
    for (_, _, arg), value in zip(spec.params, described, strict=True):
        if value is not None:
            text, compared = arg.kind.text(value, arg.param, facts)
            if arg.shown:
                shown.append(text)
            if arg.compared:
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
        facts.async_op,
    )


def _root_zero(spec: Spec, described: tuple[Any, ...]) -> tuple[Any, ...]:
    """A call's :func:`raw` description with torch's default root, where it names none.

    Args:
        spec: How the function is recorded (one of :data:`_ROOT_ZERO`).
        described: The call's description.

    Returns:
        ``described``, its global root (``src``/``dst``) 0 where neither it nor the group
        root is given.
    """
    roots = [at for at, (_, _, arg) in enumerate(spec.params) if arg.kind is ROOT]
    if not roots or any(described[at] is not None for at in roots):
        return described
    first = roots[0]  # src/dst, the global one, comes before group_src/group_dst
    return (*described[:first], 0, *described[first + 1 :])
