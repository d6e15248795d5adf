"""A sweep's work inside a rank: count what a clean run issued, run a ``verify=`` callable.

A sweep over ``at="all"`` (:func:`harness.faults.sweep`) needs each rank's collectives of
a clean run of the test, per process group, with their call sites, and what the count
depends on: :func:`counted` runs the test's body and writes them, and the files the rank
imported, to a file for the controller (:mod:`harness.plugin.sweep_count`).
:func:`verified` runs a marker's ``verify=`` on a fresh world after a case, with the
arguments it names.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch.distributed as dist

from harness.rank import recording

RANK_ARGS = ("rank", "world_size")
"""The arguments of a ``verify=`` callable that each rank fills in itself."""


def counted(path: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` (a test's body), then write the collectives it issued on each
    process group, and the files of the modules the rank imported, to ``path`` plus
    ``.rank<N>.json``.

    The file holds ``{"issued": {group: [[op, site, origin], ...]}, "files": [...]}``, where
    a group is ``""`` (the default group) or its sorted ranks joined by commas (as a fault's
    ``group`` names it); the plugin keeps the project's files among them
    (:mod:`harness.plugin.sweep_key`).

    Returns:
        What ``fn`` returned.
    """
    result = fn(*args)
    main = threading.main_thread().ident or 0
    issued: dict[str, list[list[str]]] = {}
    for history in recording.snapshot(main).groups.values():
        key = "" if history.ranks is None else ",".join(map(str, sorted(history.ranks)))
        # One pass (history.at() per number would decode the whole history each time);
        # collectives past the kept sequence are counted without their op and site.
        records = [[op.name, site, op.origin] for op, site, _, _ in history.spans()]
        records += [["?", "", ""]] * (history.count - len(records))
        # Two groups of the same ranks: a fault at #N acts at the first to reach it.
        if len(records) > len(issued.get(key, [])):
            issued[key] = records
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    target = f"{path}.rank{rank}.json"
    files = [getattr(module, "__file__", None) for module in list(sys.modules.values())]
    imported = sorted({file for file in files if isinstance(file, str)})
    with open(target + ".tmp", "w", encoding="utf-8") as handle:
        json.dump({"issued": issued, "files": imported}, handle)
    os.replace(target + ".tmp", target)
    return result


def verified(verify: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """Call ``verify`` with ``kwargs``, and ``rank`` / ``world_size`` where it names them."""
    names = set(kwargs.get("_harness_rank_args", ()))
    given = {key: value for key, value in kwargs.items() if key != "_harness_rank_args"}
    if "rank" in names:
        given["rank"] = dist.get_rank() if dist.is_initialized() else 0
    if "world_size" in names:
        given["world_size"] = dist.get_world_size() if dist.is_initialized() else 1
    return verify(**given)
