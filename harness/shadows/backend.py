"""The process groups of a shadow world: a backend of the harness's own.

Every group of a simulated rank is a :class:`ShadowGroup`, a ``torch.distributed.ProcessGroup``
written in Python and registered as backend ``"shadow"`` (:func:`register`): torch hands it
every collective its group issues, whoever issues it (``torch.distributed``'s functions, DDP's
reducer in C++, functional collectives, DTensor), on every torch release. Each collective
completes at once, with the data it would have if every rank of the group held this rank's
data: an all-reduce SUM multiplies by the group's size, an all-gather copies, a
reduce-scatter or all-to-all gives this rank's part in the shapes a real one gives; its
``Work`` is done and its future holds the tensors, as DDP's hooks and FSDP2 expect.

A collective issued through ``torch.distributed``'s functions is recorded by their wrapper
(:mod:`harness.rank.recording.recorder`), as on a real rank; one torch issued below them is
recorded here, as torch's process-group hooks would record it
(:func:`harness.rank.recording.hooks.note_below`), and noted as seen here alone
(:func:`noting`). torch's own fake process group is not used: before torch 2.15 its
collectives leave the data as it is and its ``Work``'s future holds no tensors (DDP's
backward fails on it), and before 2.14 nothing records what it runs from C++.

Imports: see :mod:`harness.shadows`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from harness import compat
from harness.protocol.traces import COMPLETED
from harness.rank import recording
from harness.rank.recording import hooks
from harness.rank.recording.hook_ops import KINDS
from harness.rank.recording.records import Record, returned

BACKEND = "shadow"
"""The backend's name (``torch.distributed.get_backend()`` says it in a simulated rank)."""

Noted = Callable[[Record], None]
"""Told each collective recorded here alone (see ``SimulatedRank.below``)."""

_noted: list[Noted] = []
"""Where this process's groups tell what they alone record (:func:`noting`), the one
simulated rank a process is. Module-level: torch makes the groups, with its own arguments."""


def register() -> None:
    """Register the backend ``"shadow"``.

    In the host, before it forks the simulated ranks, which find it registered (the rank's
    reset restores torch's registry of backends after each call, so each call registers it).
    """

    def create(options: Any, backend_options: Any) -> ShadowGroup:
        ranks = tuple(options.global_ranks_in_group) or None  # [] for the default group
        return ShadowGroup(options.group_rank, options.group_size, ranks)

    dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu", "cuda"])
    compat.completed_work([])  # once here: each rank's first Work then costs less


def noting(noted: Noted) -> None:
    """Have this process's groups tell ``noted`` each collective they alone record."""
    _noted[:] = [noted]


# torch's stubs type each collective method with one signature or another by release; the
# class overrides them as each release's C++ calls them.
if TYPE_CHECKING:
    _ProcessGroup = object
else:
    _ProcessGroup = dist.ProcessGroup


class ShadowGroup(_ProcessGroup):
    """One group of a shadow world, as seen by one of its members.

    Args:
        rank: This rank's rank in the group.
        size: The group's size.
        ranks: Its members' global ranks (None: every rank, the default group).
    """

    def __init__(self, rank: int, size: int, ranks: tuple[int, ...] | None) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._rank, self._size, self._ranks = rank, size, ranks
        self._name = ""

    def getBackendName(self) -> str:
        return BACKEND

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    @property
    def group_name(self) -> str:
        return self._name

    def _issue(self, name: str, tensors: Sequence[Any], root: int = -1, opts: Any = None) -> None:
        """Record a collective issued below ``torch.distributed``'s functions (one they
        issued is their wrapper's record)."""
        recorder = recording.current()
        if recorder is None or (recorder.busy and threading.get_ident() in recorder.busy):
            return
        async_op = bool(getattr(opts, "asyncOp", False))
        # The frame that called into torch: this method's caller's.
        record = hooks.note_below(
            recorder, self, KINDS[name], tensors, root, async_op, compat.frame(2)
        )
        if record is not None:
            returned(record, COMPLETED)  # at once: no peer to wait for
            for noted in _noted:
                noted(record)

    def _reduced(self, tensor: Any, opts: Any) -> Any:
        """``tensor`` reduced over the group as if every member held it."""
        op = opts.reduceOp
        if tensor.dtype == torch.bool:
            return tensor  # SUM is OR, PRODUCT is AND: as it is
        if op == dist.ReduceOp.SUM:
            tensor.mul_(self._size)
        elif op == dist.ReduceOp.PRODUCT:
            tensor.pow_(self._size)
        elif op == dist.ReduceOp.BXOR and self._size % 2 == 0:
            tensor.zero_()
        return tensor  # AVG, MIN, MAX, BAND, BOR: as it is

    def _chunks(self, tensor: Any) -> Any:
        return tensor.chunk(self._size) if tensor.dim() else [tensor]

    def allreduce(self, tensors: list[Any], opts: Any) -> Any:
        self._issue("ALLREDUCE", tensors, opts=opts)
        return _done([self._reduced(t, opts) for t in tensors])

    def allreduce_coalesced(self, tensors: list[Any], opts: Any) -> Any:
        self._issue("ALLREDUCE_COALESCED", tensors, opts=opts)
        return _done([self._reduced(t, opts) for t in tensors])

    def broadcast(self, tensors: list[Any], opts: Any) -> Any:
        self._issue("BROADCAST", tensors, opts.rootRank, opts)
        return _done(tensors)  # the root's data is this rank's

    def reduce(self, tensors: list[Any], opts: Any) -> Any:
        self._issue("REDUCE", tensors, opts.rootRank, opts)
        if self._rank == opts.rootRank:
            tensors = [self._reduced(t, opts) for t in tensors]
        return _done(tensors)

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any) -> Any:
        self._issue("ALLGATHER", inputs, opts=opts)
        for outs, tensor in zip(outputs, inputs, strict=False):
            for out in outs:
                out.copy_(tensor)
        return _done(outputs)

    def allgather_coalesced(self, outputs: list[list[Any]], inputs: list[Any], opts: Any) -> Any:
        self._issue("ALLGATHER_COALESCED", inputs, opts=opts)
        for outs in outputs:
            for out, tensor in zip(outs, inputs, strict=False):
                out.copy_(tensor)
        return _done(outputs)

    def all_gather_single(self, output: Any, input: Any, opts: Any) -> Any:
        self._issue("ALLGATHER_BASE", [input], opts=opts)
        _gathered(output, input, self._size)
        return _done([output])

    def all_gather_single_coalesced(self, outputs: list[Any], inputs: list[Any], opts: Any) -> Any:
        self._issue("ALLGATHER_INTO_TENSOR_COALESCED", inputs, opts=opts)
        for output, tensor in zip(outputs, inputs, strict=False):
            _gathered(output, tensor, self._size)
        return _done(outputs)

    def reduce_scatter(self, outputs: list[Any], inputs: list[list[Any]], opts: Any) -> Any:
        self._issue("REDUCE_SCATTER", [t for ins in inputs for t in ins], opts=opts)
        for out, ins in zip(outputs, inputs, strict=False):
            out.copy_(ins[self._rank])
            self._reduced(out, opts)
        return _done(outputs)

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any) -> Any:
        self._issue("REDUCE_SCATTER_BASE", [output], opts=opts)
        output.copy_(self._chunks(input)[self._rank].reshape(output.shape))
        return _done([self._reduced(output, opts)])

    def reduce_scatter_single_coalesced(
        self, outputs: list[Any], inputs: list[Any], opts: Any
    ) -> Any:
        self._issue("REDUCE_SCATTER_TENSOR_COALESCED", inputs, opts=opts)
        for output, tensor in zip(outputs, inputs, strict=False):
            output.copy_(self._chunks(tensor)[self._rank].reshape(output.shape))
            self._reduced(output, opts)
        return _done(outputs)

    def alltoall(self, outputs: list[Any], inputs: list[Any], opts: Any) -> Any:
        self._issue("ALLTOALL", inputs, opts=opts)
        # From each peer, what it sends this rank: this rank's own part, where shapes agree.
        mine = inputs[self._rank] if self._rank < len(inputs) else None
        for out in outputs:
            if mine is not None and out.shape == mine.shape:
                out.copy_(mine)
        return _done(outputs)

    def all_to_all_single(
        self,
        output: Any,
        input: Any,
        output_splits: list[int],
        input_splits: list[int],
        opts: Any,
    ) -> Any:
        self._issue("ALLTOALL_BASE", [input], opts=opts)
        sent = input.split(list(input_splits)) if input_splits else self._chunks(input)
        received = output.split(list(output_splits)) if output_splits else self._chunks(output)
        mine = sent[self._rank] if self._rank < len(sent) else None
        for out in received:
            if mine is not None and out.shape == mine.shape:
                out.copy_(mine)
        return _done([output])

    def gather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any) -> Any:
        self._issue("GATHER", inputs, opts.rootRank, opts)
        for outs, tensor in zip(outputs, inputs, strict=False):
            for out in outs:
                out.copy_(tensor)
        return _done(outputs)

    def gather_single(self, output: Any, input: Any, opts: Any) -> Any:
        self._issue("GATHER", [input], opts.rootRank, opts)
        if self._rank == opts.rootRank:
            _gathered(output, input, self._size)
        return _done([output])

    def scatter(self, outputs: list[Any], inputs: list[list[Any]], opts: Any) -> Any:
        self._issue("SCATTER", outputs, opts.rootRank, opts)
        if inputs:  # the root's: a rank elsewhere receives what it cannot know
            for out, ins in zip(outputs, inputs, strict=False):
                out.copy_(ins[self._rank])
        return _done(outputs)

    def barrier(self, opts: Any) -> Any:
        self._issue("BARRIER", [], opts=opts)
        return _done([])

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        self._issue("BARRIER", [])

    def send(self, tensors: list[Any], dst: int, tag: int) -> Any:
        self._issue("SEND", tensors, dst)
        return _done(tensors)

    def recv(self, tensors: list[Any], src: int, tag: int) -> Any:
        self._issue("RECV", tensors, src)
        return _done(tensors)  # what a peer sends cannot be known: the buffer as it is

    def recv_anysource(self, tensors: list[Any], tag: int) -> Any:
        self._issue("RECV", tensors)
        return _done(tensors)

    # Names older torch releases gave the methods above, which their C++ still calls.
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single
    gather_into_tensor = gather_single

    def __repr__(self) -> str:
        return f"ShadowGroup(rank {self._rank} of {self._size})"


def _gathered(output: Any, tensor: Any, size: int) -> None:
    """Fill an all-gather's output with ``size`` copies of ``tensor``."""
    if output.dim() == 0:
        output.copy_(tensor)
        return
    for part in output.chunk(size):
        part.copy_(tensor.reshape(part.shape))


def _done(value: Any) -> Any:
    return compat.completed_work(value)
