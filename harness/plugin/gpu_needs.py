"""What a distributed test needs of the run's GPUs: pure decisions, without torch.

A test's need (:class:`GpuNeed`) is one of three kinds:

* ``gpus_per_rank`` GPUs for each rank (the marker's, else 1 with NCCL and 0 with any other
  backend): ``world_size x gpus_per_rank`` GPUs;
* ``ranks_per_gpu=K`` (the marker's, else ini ``dist_ranks_per_gpu``), NCCL ranks sharing
  GPUs: ``ceil(world_size / K)`` GPUs, rank ``r`` on the ``r % G``-th (NCCL 2.30 and later);
* a ``--dist-mptc`` test's own minimum (torch 2.15's ``_min_gpus_required``): that many.

The ini value is a default for the tests it can apply to (NCCL, one GPU per rank); only a
marker that asks for what cannot be is a usage error. :mod:`harness.plugin.leases` takes the
GPUs and words the skip; :mod:`harness.protocol.devices` lays them out for the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import validate

SHARING_BACKENDS = ("auto", "nccl")
"""The backends a marker may name with ``ranks_per_gpu > 1`` (``auto``: NCCL where it
counts, with CUDA; without CUDA it resolves to Gloo and leases nothing)."""


@dataclass(frozen=True)
class GpuNeed:
    """The GPUs a test's world leases; false where it leases none.

    Attributes:
        per_rank: GPUs each rank leases (0: none).
        ranks_per_gpu: Ranks that share one GPU (1: none share); only with ``per_rank`` 1.
        fixed: A count whatever the world size (``--dist-mptc``); 0: none.
    """

    per_rank: int = 0
    ranks_per_gpu: int = 1
    fixed: int = 0

    def __bool__(self) -> bool:
        return bool(self.per_rank or self.fixed)

    def count(self, world_size: int) -> int:
        """How many GPUs a world of ``world_size`` ranks leases."""
        if self.fixed:
            return self.fixed
        if self.ranks_per_gpu > 1:
            return -(-world_size // self.ranks_per_gpu)
        return world_size * self.per_rank

    def shares(self, world_size: int) -> bool:
        """Whether some ranks of a world of ``world_size`` share a GPU."""
        return 0 < self.count(world_size) < world_size

    def shortfall(self, world_size: int, have: int) -> str | None:
        """The skip reason of a world of ``world_size`` ranks on a run of ``have`` GPUs
        (``"needs 4 GPUs (4 x 1), this run has 2"``); None where they are enough."""
        needed = self.count(world_size)
        if needed <= have:
            return None
        if self.fixed:
            why = "the test's _min_gpus_required"
        elif self.ranks_per_gpu > 1:
            why = f"{world_size} ranks, {self.ranks_per_gpu} per GPU"
        else:
            why = f"{world_size} x {self.per_rank}"
        noun = "GPU" if needed == 1 else "GPUs"
        return f"needs {needed} {noun} ({why}), this run has {have}"


def ranks_per_gpu(
    marker: object, ini: int, marker_backend: object, gpus_per_rank: int | None
) -> int:
    """How many ranks of a test share one GPU.

    Args:
        marker: The marker's ``ranks_per_gpu`` (None: not given).
        ini: Ini ``dist_ranks_per_gpu`` (1 by default): used where the marker gives none and
            the test can share (it names no backend but NCCL and leases one GPU per rank).
        marker_backend: The backend the marker names (``"auto"`` where it names none).
        gpus_per_rank: The marker's ``gpus_per_rank``, checked (None: not given).

    Raises:
        TypeError: ``marker`` is not an int (``True`` is not).
        ValueError: ``marker`` is below 1, or above 1 with a backend other than NCCL or
            with ``gpus_per_rank`` other than 1.
    """
    named = str(marker_backend).lower()
    if marker is None:
        usable = named in SHARING_BACKENDS and gpus_per_rank in (None, 1)
        return ini if usable else 1
    shared = validate.positive_int(marker, "ranks_per_gpu")
    if shared == 1:
        return 1
    if named not in SHARING_BACKENDS:
        raise ValueError(
            f"ranks_per_gpu={shared} shares GPUs between NCCL ranks, but the backend is "
            f"{marker_backend!r}; use backend='nccl' (or 'auto'), or ranks_per_gpu=1"
        )
    if gpus_per_rank is not None and gpus_per_rank != 1:
        raise ValueError(
            f"gpus_per_rank={gpus_per_rank} and ranks_per_gpu={shared} cannot both hold: a "
            "rank either leases GPUs of its own or shares one; give gpus_per_rank=1 (or "
            "leave it out) with ranks_per_gpu, or ranks_per_gpu=1"
        )
    return shared


def need(backend: str, gpus_per_rank: int | None, shared: int) -> GpuNeed:
    """A test's need, once its backend is resolved (``"nccl"``, ``"gloo"``, ...).

    Args:
        backend: The resolved backend.
        gpus_per_rank: The marker's (None: 1 with NCCL, else 0).
        shared: :func:`ranks_per_gpu`'s answer; it applies to NCCL worlds alone.
    """
    per_rank = gpus_per_rank if gpus_per_rank is not None else int(backend == "nccl")
    sharing = shared if backend == "nccl" and per_rank == 1 else 1
    return GpuNeed(per_rank=per_rank, ranks_per_gpu=sharing)


def mptc_need(min_gpus: int | None) -> GpuNeed:
    """A ``--dist-mptc`` test's need: its ``_min_gpus_required`` (None: it leases none)."""
    return GpuNeed(fixed=min_gpus) if min_gpus else GpuNeed()
