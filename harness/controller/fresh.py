"""``harness.run``: one run on fresh ranks.

The ranks are stopped before it returns; it makes its restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from harness import validate
from harness.controller.calls import result
from harness.controller.outcome import Outcome
from harness.controller.restarts import run_attempts
from harness.controller.world import World
from harness.faults import Fault
from harness.faults.checks import plan
from harness.protocol.messages import CallOptions


def run(
    fn: Callable[..., Any],
    *,
    world_size: int,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    backend: str = "auto",
    timeout: float | None = validate.DEFAULT_TIMEOUT_S,
    init: bool = True,
    check_collectives: bool = True,
    faults: Sequence[Fault] = (),
    restarts: int | Sequence[int] = 0,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` once on fresh ranks.

    It runs once on each of ``world_size`` fresh ranks, stopped before this returns.

    Each rank has the torchrun environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``) and a default process
    group from ``fhelium.distributed.init``; with ``init=False`` no group, but a private
    ``INIT_METHOD`` and ``MASTER_PORT`` for ``fn`` to make one (see :class:`World`). A script
    that calls this at import time needs the ``if __name__ == "__main__":`` guard, as with
    multiprocessing's spawn and forkserver start methods.

    Args:
        fn: A picklable (module-level) callable, as for :meth:`World.run`.
        world_size: Number of ranks (>= 1).
        args: Positional arguments for ``fn`` (a tuple or other iterable), sent to every rank.
        kwargs: Keyword arguments for ``fn``, sent to every rank.
        backend: ``"auto"``, ``"gloo"`` or ``"nccl"``, as for :class:`World`.
        timeout: Bound in seconds on the run (start-up has its own 60 s bound): 120 s
            unless given, as for a distributed test; None: none.
        init: Whether the ranks start in a default process group, as for :class:`World`.
        check_collectives: Whether the ranks' collectives are compared after a call that
            returned on every rank, as for :meth:`World.run`.
        faults: Faults to inject (:mod:`harness.faults`), as for :meth:`World.run`; each
            acts in its own ``attempt`` of a run with restarts.
        restarts: How many times the run starts again on fresh ranks when a rank fails or a
            fault ends it, as torchrun's ``--max-restarts`` (an int); or the world size of
            each restart (``[2]``: one restart, on 2 ranks). Each attempt's ranks see its
            number as ``TORCHELASTIC_RESTART_COUNT`` (``harness.restart_count()``).

    Returns:
        The return values of the last attempt, index = rank.

    Raises:
        RankError: Code raised on one or more ranks (root cause first).
        WorldTimeout: The run did not finish in time.
        WorldHang: Its collectives can never complete.
        RankCrash: A rank process died during the run.
        CollectiveMismatch: Every rank returned, or was stopped, and their collectives
            differ.
        FaultNotFired: A fault never acted.
        DistributedError: Something could not be pickled, or a rank did not start.
        TypeError: An argument of the wrong type (``world_size``, ``args``, ``init``,
            ``restarts``, ...).
        ValueError: An argument out of range (``world_size``, ``backend``, ``timeout``,
            ``restarts``), or a fault whose ``attempt`` the run does not have.
        RuntimeError: The backend cannot run here.
    """
    # Before the ranks start: a mistake here needs no world to be found.
    args, kwargs = validate.call_args(args), validate.call_kwargs(kwargs)
    size = validate.positive_int(world_size, "world_size")
    options = CallOptions(check_collectives=check_collectives)
    planned = plan(options, faults, restarts, size)
    worlds: dict[int, World] = {}

    def attempt(size: int, options: CallOptions) -> Outcome:
        world = worlds.get(size)
        if world is None:
            world = worlds[size] = World(size, backend=backend, timeout=timeout, init=init)
        return world.call(fn, args, kwargs, options)

    try:
        outcome, _ = run_attempts(attempt, planned.options, planned.sizes)
    finally:
        for world in worlds.values():
            world.close()
    return result(outcome)
