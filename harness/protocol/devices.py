"""Which GPUs of a world's lease each rank sees, and which of them is its own.

The controller writes a rank's GPU environment from the world's lease (:func:`lease_env`);
the rank reads its own device back from it (:func:`own_device`). Both follow one rule, the
one torch's NCCL backend applies when it binds its device by itself: rank ``r``'s device is
``cuda:(LOCAL_RANK % device_count)``.

Since torch 2.15, ``backend="nccl"`` binds its GPU when the process group is made, from
``device_id`` if given and else from ``LOCAL_RANK % torch.cuda.device_count()``, and ignores
``torch.cuda.set_device``. A world whose ranks call ``init_process_group`` themselves
(``init=False``) so binds what that formula names, whatever the test set as its current
device: the environment must make it the rank's own GPU. Three layouts, by the lease's size
``G`` against the world's ``N`` ranks:

* ``G`` a multiple of ``N`` (``gpus_per_rank = G / N``): every rank sees the whole lease,
  rotated so that its own GPUs come at ``cuda:LOCAL_RANK`` onwards. The same order on every
  rank (torchrun's) would put rank ``r``'s first GPU at ``r * gpus_per_rank``, so that with 2
  GPUs per rank nccl2's default binds rank 1 to rank 0's second GPU. A rotation keeps every
  leased GPU visible to every rank (peer access and CUDA IPC between the world's GPUs work as
  before) and makes every default agree: nccl2's, ``fhelium.distributed.init()``'s
  ``cuda:LOCAL_RANK``, and a test's ``torch.cuda.set_device(LOCAL_RANK)``.
* ``G`` smaller than ``N`` (``ranks_per_gpu``): every rank sees the lease in order and rank
  ``r`` uses ``cuda:(r % G)``, nccl2's default and torch's own convention; the ranks get
  ``NCCL_MULTI_RANK_GPU_ENABLE=1``, without which NCCL refuses two ranks on one GPU.
* any other size (``--dist-mptc``'s lease of a test's own minimum of GPUs): the lease in
  order on every rank, as a native ``MultiProcessTestCase`` process sees its GPUs.

Standard library only, as all of :mod:`harness.protocol`.
"""

from __future__ import annotations

from harness.protocol.messages import GPUS_PER_RANK

RANKS_PER_GPU = "HARNESS_RANKS_PER_GPU"
"""Set in the ranks of a world whose ranks share GPUs: the most ranks on one GPU."""

LEASED_GPUS = "HARNESS_GPUS"
"""Set in every rank of a world that holds GPUs: the lease, in its own order (the same on
every rank, whatever order the rank's ``CUDA_VISIBLE_DEVICES`` has)."""

MULTI_RANK_GPU = "NCCL_MULTI_RANK_GPU_ENABLE"
"""NCCL's switch (2.30 and later) that lets several ranks of a communicator share a GPU."""

VISIBLE = "CUDA_VISIBLE_DEVICES"


def lease_env(gpus: tuple[str, ...], rank: int, world_size: int) -> dict[str, str]:
    """The GPU environment of ``rank`` of a world of ``world_size`` ranks that holds ``gpus``.

    Args:
        gpus: The world's lease, in order (``CUDA_VISIBLE_DEVICES`` names); not empty.
        rank: The rank (its ``LOCAL_RANK``: the harness's worlds are single-node).
        world_size: The world's ranks.

    Returns:
        ``CUDA_VISIBLE_DEVICES``, :data:`LEASED_GPUS`, and :data:`GPUS_PER_RANK` or
        :data:`RANKS_PER_GPU` with :data:`MULTI_RANK_GPU` as the module's docstring says.

    Raises:
        ValueError: ``gpus`` is empty, or ``rank`` is not in ``[0, world_size)``.
    """
    if not gpus:
        raise ValueError("a world's lease holds at least one GPU, got none")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not a rank of a world of {world_size}")
    count = len(gpus)
    env = {LEASED_GPUS: ",".join(gpus), VISIBLE: ",".join(gpus)}
    if count % world_size == 0:
        per_rank = count // world_size
        # Left by r * (per_rank - 1): position r then holds lease[r * per_rank], and
        # positions r .. r + per_rank - 1 the rank's per_rank GPUs (never past the end).
        shift = rank * (per_rank - 1)
        env[VISIBLE] = ",".join(gpus[shift:] + gpus[:shift])
        env[GPUS_PER_RANK] = str(per_rank)
    elif count < world_size:
        env[RANKS_PER_GPU] = str(-(-world_size // count))
        env[MULTI_RANK_GPU] = "1"
    return env


def own_device(local_rank: int, visible: int) -> int:
    """The CUDA index of a rank's (first) GPU: ``local_rank % visible``, as nccl2 binds it.

    Args:
        local_rank: The rank's ``LOCAL_RANK``.
        visible: How many devices the rank sees (its lease's size).

    Raises:
        ValueError: ``visible`` is below 1 or ``local_rank`` negative.
    """
    if visible < 1 or local_rank < 0:
        raise ValueError(f"no device for LOCAL_RANK={local_rank} among {visible} visible")
    return local_rank % visible
