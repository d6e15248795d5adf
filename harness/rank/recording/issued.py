"""The ``collectives`` fixture's value: what this rank's call in progress has issued so far,
read from its recorder (:mod:`harness.rank.recording.recorder`) at each use."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import torch.distributed as dist

from harness.protocol.traces import IssuedCollective
from harness.rank.recording.recorder import current


def collectives() -> list[IssuedCollective]:
    """The collectives this rank's call in progress has issued so far.

    Raises:
        RuntimeError: No call is in progress (outside a rank, or between calls).
    """
    recorder = current()
    if recorder is None:
        raise RuntimeError(
            "collectives are recorded while a test or a World.run call runs in a rank; "
            "none is running here"
        )
    return recorder.issued(dist.get_world_size() if dist.is_initialized() else 1)


class Issued(Sequence[IssuedCollective]):
    """The ``collectives`` fixture's value, read anew at each use (``len``, indexing,
    iteration, comparison with a list)."""

    def __len__(self) -> int:
        return len(collectives())

    @overload
    def __getitem__(self, index: int) -> IssuedCollective: ...

    @overload
    def __getitem__(self, index: slice) -> list[IssuedCollective]: ...

    def __getitem__(self, index: int | slice) -> IssuedCollective | list[IssuedCollective]:
        return collectives()[index]

    def __iter__(self) -> Iterator[IssuedCollective]:
        return iter(collectives())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple)):
            return collectives() == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return repr(collectives())
