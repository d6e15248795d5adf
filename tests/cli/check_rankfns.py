"""Functions the ``harness check`` tests run inside ranks (module level: they travel by
pickle): every row in one call, and a change a ``faults.corrupt`` makes to an input."""

from __future__ import annotations

import torch
import torch.distributed as dist

from fhelium.distributed import local_device
from harness.rank import check_rows
from harness.rank.check_rows import DEFAULT_REPEATS, NEEDS_NUMPY, Row


def check_collectives(repeats: int = DEFAULT_REPEATS) -> list[Row]:
    """Every row in one call, for ``harness.run``: one
    :func:`~harness.rank.check_rows.check_row` after another.

    The ranks first agree, with an ``all_reduce``, whether torch can use numpy on all of
    them; if not, the object collectives' rows are ``n/a: needs numpy`` on every rank and
    none of them runs (the command line decides this from :func:`~harness.rank.check_rows.
    rank_info` instead, as its rows are separate calls).
    """
    problem = check_rows.numpy_problem()
    missing = torch.tensor([problem is not None], dtype=torch.int32, device=local_device())
    dist.all_reduce(missing, op=dist.ReduceOp.MAX)
    numpy_everywhere = not missing.item()
    rows = []
    for name in check_rows.row_names():
        if check_rows.needs_numpy(name) and not numpy_everywhere:
            rows.append(Row(name, NEEDS_NUMPY, None))
        else:
            rows.append(check_rows.check_row(name, repeats))
    return rows


def add_one(tensor: torch.Tensor) -> None:
    """Add 1 to every value, in place."""
    tensor.add_(1)
