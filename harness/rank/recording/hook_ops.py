"""How a collective torch's process-group hooks saw reads (:mod:`harness.rank.recording.hooks`).

torch names the collective by a ``HookOpName``; each one recorded reads as the
``torch.distributed`` function that does the same (:data:`KINDS`), with the tensors, root and
``async_op`` the hooks give (not the reduce op: they do not say), and what the user's code
called that issued it (:func:`origin`: ``backward (DDP)``, ``DTensor.redistribute``,
``functional all_reduce``...).

Imports: see :mod:`harness.rank`.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from harness.protocol.traces import Op
from harness.rank.recording.describe import tensor_text

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_ENGINE = os.path.join(_TORCH_DIR, "autograd", "graph.py")


class Kind(NamedTuple):
    """How a collective torch names by a ``HookOpName`` is recorded.

    Attributes:
        name: The ``torch.distributed`` function it reads as.
        p2p: A point-to-point op: not numbered, never compared.
        root: How its ``root`` reads (``"src"``, ``"dst"``; '' where it has none).
        outputs: Its tensors are its outputs (``scatter``: only the root has inputs;
            ``reduce_scatter_tensor``: its output is what ``torch.distributed`` compares).
        shapes: Whether members agree on its shapes (not ``all_to_all``'s splits).
        listed: Its tensors read as one list (``[float32[4], int64[2]]``), as
            ``torch.distributed``'s function of that name reads the same call.
    """

    name: str
    p2p: bool = False
    root: str = ""
    outputs: bool = False
    shapes: bool = True
    listed: bool = False


KINDS = {
    "ALLREDUCE": Kind("all_reduce"),
    "ALLREDUCE_COALESCED": Kind("all_reduce_coalesced", listed=True),
    "BROADCAST": Kind("broadcast", root="src"),
    "REDUCE": Kind("reduce", root="dst"),
    "ALLGATHER": Kind("all_gather"),
    "ALLGATHER_BASE": Kind("all_gather_into_tensor"),
    "ALLGATHER_COALESCED": Kind("all_gather_coalesced", listed=True),
    "ALLGATHER_INTO_TENSOR_COALESCED": Kind("all_gather_into_tensor_coalesced"),
    "REDUCE_SCATTER": Kind("reduce_scatter"),
    "REDUCE_SCATTER_BASE": Kind("reduce_scatter_tensor", outputs=True),
    "REDUCE_SCATTER_TENSOR_COALESCED": Kind("reduce_scatter_tensor_coalesced"),
    "ALLTOALL": Kind("all_to_all", shapes=False),
    "ALLTOALL_BASE": Kind("all_to_all_single", shapes=False),
    "BARRIER": Kind("barrier"),
    "SCATTER": Kind("scatter", root="src", outputs=True),
    "GATHER": Kind("gather", root="dst"),
    "SEND": Kind("send", p2p=True, root="dst"),
    "RECV": Kind("recv", p2p=True, root="src", outputs=True),
    "UNKNOWN": Kind("collective"),
}
"""Each ``HookOpName`` recorded, by name (``SPLIT`` and ``NEW_WINDOW`` make communicators
and windows: no collective of the user's)."""


def kind_of(member: Any) -> Kind | None:
    """The kind of a ``HookOpName`` member (None: not recorded)."""
    return KINDS.get(member.name)


def op(kind: Kind, raw: Any, root: int, async_op: bool, origin: str, group: Any) -> Op:
    """How a collective recorded by the hooks reads (``group``: its handle, None: default)."""
    shown: list[str] = []
    compared: list[str] = []
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
    texts = [tensor_text(value) for value in raw]
    bare = [tensor_text(value, device=False) for value in raw]
    if kind.listed:
        shown.append(f"[{', '.join(texts)}]")
    else:
        shown += texts
    if kind.shapes:
        compared += [f"[{', '.join(bare)}]"] if kind.listed else bare
    else:
        compared.append("/".join(sorted({str(value[0]).removeprefix("torch.") for value in raw})))
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


def origin(kind: Kind, callee: Any, innermost: Any) -> str:
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
