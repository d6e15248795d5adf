"""The memory of a World's ranks, as their answers tell it, and the limit that replaces them.

Each rank says its memory as it comes up (``Ready``) and after each call it answers (``Done``,
``Skipped``; see :mod:`harness.rank.memory`): :class:`Memories` keeps it per rank, as
:class:`RankMemory`, and says when a rank holds more than the World's ``max_rank_memory``,
which the World then answers by replacing its ranks with fresh processes before the next
call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from harness.protocol.messages import Done, MemoryUse, Ready, Skipped, megabytes


class LimitBelowStart(ValueError):
    """A World's ``max_rank_memory`` is below what its ranks hold as they start."""


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory, as its World saw it, in bytes.

    Attributes:
        start: Its resident set size as its current process came up.
        last: Its resident set size after the last call it answered (freed memory given back).
        peak: The largest resident set size any of the World's processes for this rank had
            (the kernel's high-water mark, so also within a call).
        calls: How many calls its current process answered.
        cuda_allocated: ``torch.cuda.memory_allocated()`` after the last call, where CUDA is
            in use (else None).
        cuda_reserved: ``torch.cuda.memory_reserved()`` alike.
    """

    start: int
    last: int
    peak: int
    calls: int = 0
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None

    @property
    def growth_per_call(self) -> float:
        """How much each call added on average, in bytes: ``(last - start) / calls`` (0.0
        before the first)."""
        return (self.last - self.start) / self.calls if self.calls else 0.0


class Memories:
    """The memory of one World's ranks, by rank, kept as their answers come.

    Attributes:
        limit: The World's ``max_rank_memory`` in bytes (None: none).
        ranks: Each rank's memory (empty where the platform does not say).
        replaced: How many times the World's ranks were replaced for memory.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.ranks: dict[int, RankMemory] = {}
        self.replaced = 0

    def started(self, replies: Mapping[int, object]) -> None:
        """Note a new process per rank, from its ``Ready``; the peaks of the old ones stay."""
        for rank, reply in replies.items():
            use = reply.memory if isinstance(reply, Ready) else None
            if use is not None:
                old = self.ranks.get(rank)
                peak = max(use.peak, old.peak) if old is not None else use.peak
                self.ranks[rank] = RankMemory(use.resident, use.resident, peak)

    def answered(self, replies: Mapping[int, object]) -> None:
        """Note each rank's memory after a call, where its answer says it."""
        for rank, reply in replies.items():
            use: MemoryUse | None = reply.memory if isinstance(reply, (Done, Skipped)) else None
            old = self.ranks.get(rank)
            if use is None or old is None:
                continue
            self.ranks[rank] = replace(
                old,
                last=use.resident,
                peak=max(old.peak, use.peak),
                calls=old.calls + 1,
                cuda_allocated=use.cuda_allocated,
                cuda_reserved=use.cuda_reserved,
            )

    def over_limit(self) -> str:
        """Which ranks hold more than the limit after the last call ('' when none does):
        ``"rank 1 holds 460.0 MiB"``."""
        if self.limit is None:
            return ""
        over = [
            f"rank {rank} holds {megabytes(memory.last)}"
            for rank, memory in sorted(self.ranks.items())
            if memory.last > self.limit
        ]
        return ", ".join(over)

    def below_start(self) -> str:
        """Why the limit cannot be kept: the ranks that start above it ('' when none do)."""
        if self.limit is None:
            return ""
        over = [
            f"rank {rank} starts with {megabytes(memory.start)}"
            for rank, memory in sorted(self.ranks.items())
            if memory.start >= self.limit
        ]
        if not over:
            return ""
        return (
            f"max_rank_memory {megabytes(self.limit)} ({self.limit} bytes) is below what this "
            f"world's ranks hold as they start ({', '.join(over)}): every call would replace "
            "them; give a limit above their start"
        )
