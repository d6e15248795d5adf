"""Rank functions the ``harness check`` tests send in place of the product's: a row with a
fault injected, and every row in one call.

A fault is made the way a broken backend or a rank without numpy would make it: for one row
and on one rank only, the ``torch.distributed`` function the row calls is replaced, for the
length of that row, with one that misbehaves around the real collective. The product's
:func:`harness.rank.check_rows.check_row` runs unchanged and must turn what it sees into the
right row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from fhelium.distributed import local_device
from harness.rank import check_rows
from harness.rank.check_rows import DEFAULT_REPEATS, NEEDS_NUMPY, Row

Faults = Mapping[str, tuple[str, int]]
"""``{row name: (action, rank)}``: that rank misbehaves in that row; ``action`` is one of
:data:`ACTIONS`."""

ACTIONS = ("corrupt", "raise", "hang")
"""What the faulty function does on its rank: alter the result in place after the real
collective (the row must be a FAIL), raise after the real collective returned (as torch does
without numpy, on the receiving ranks only: the peers go on to the next repetition and wait
there), or never enter the collective (the peers block in it until the timeout)."""


class InjectedFault(RuntimeError):
    """Raised on the rank a test asked to fail (``("raise", rank)``)."""


def check_row(name: str, repeats: int = DEFAULT_REPEATS, faults: Faults | None = None) -> Row:
    """:func:`harness.rank.check_rows.check_row`, with ``faults`` injected on this rank.

    The function replaced is the one named by the row without ``" (async)"``
    (``all_reduce`` for ``"all_reduce (async)"``): rows of another name (``send/recv``) take
    no fault.
    """
    fault = (faults or {}).get(name)
    if fault is None or fault[1] != dist.get_rank():
        return check_rows.check_row(name, repeats)
    action = fault[0]
    if action not in ACTIONS:
        raise ValueError(f"unknown fault {action!r}; valid: {', '.join(ACTIONS)}")
    function = name.removesuffix(" (async)")
    real = getattr(dist, function)
    setattr(dist, function, _faulty(real, action, name))
    try:
        return check_rows.check_row(name, repeats)
    finally:
        setattr(dist, function, real)


def check_collectives(repeats: int = DEFAULT_REPEATS, faults: Faults | None = None) -> list[Row]:
    """Every row in one call, for ``harness.run``: one :func:`check_row` after another.

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
            rows.append(check_row(name, repeats, faults))
    return rows


def _faulty(real: Callable[..., Any], action: str, name: str) -> Callable[..., Any]:
    def faulty(*args: Any, **kwargs: Any) -> Any:
        if action == "hang":
            _hang()
        result = real(*args, **kwargs)
        for work in result if isinstance(result, list) else [result]:
            if work is not None:
                work.wait()
        if action == "raise":
            raise InjectedFault(f"injected failure in {name} on rank {dist.get_rank()}")
        _damage(args[0])  # the output, for all_reduce and broadcast
        return result

    return faulty


def _hang() -> None:
    """Never return: the peers block in the collective this rank does not enter, until the
    caller's timeout kills the ranks."""
    while True:
        time.sleep(3600)


def _damage(out: Any) -> None:
    """Make a result wrong, in place: a tensor, or the first tensor of a list."""
    if isinstance(out, list):
        out = out[0]
    out.add_(1)
