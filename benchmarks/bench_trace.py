"""What recording collectives and the desync check cost (per collective, and per call).

Run by hand, never in CI (nothing here asserts on time)::

    python benchmarks/bench_trace.py [--collectives 10000] [--calls 300] [--world-size 2]

Measured on one reused ``harness.World`` (Gloo), in one process:

* **collectives per second, with and without tracing**: inside each rank, a loop of
  ``--collectives`` ``dist.all_reduce`` calls on a 1-element tensor, timed by the rank
  itself; "with" calls ``dist.all_reduce`` (the harness's recording wrapper, recording),
  "without" calls the function the wrapper wraps (what ``dist.all_reduce`` is outside the
  harness). World size 1 as well as ``--world-size``: there a collective costs the least,
  so the wrapper's share is the largest. And the wrapper alone: a no-op in place of
  torch's function, so that the collective's own noise drops out.
* **per-call cost of the desync check**: ``World.run`` of a body, median of ``--calls``
  calls, with ``check_collectives=True`` and ``False`` interleaved (so load that comes and
  goes hits both alike); bodies with 0, 1, 10 and 100 all-reduces. The difference is what
  the check adds per call: the rank's trace in its reply, and the controller's comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def all_reduces(count: int) -> None:
    """The body of the desync-check rows: ``count`` all-reduces of one element."""
    tensor = torch.ones(1)
    for _ in range(count):
        dist.all_reduce(tensor)


def rate(count: int, traced: bool) -> float:
    """Collectives per second on this rank: ``count`` all-reduces, through the recording
    wrapper or around it."""
    fn = dist.all_reduce
    if not traced:
        fn = getattr(fn, "__harness_traced__", fn)  # the unwrapped function
    tensor = torch.ones(1)
    for _ in range(100):  # warm-up
        fn(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(count):
        fn(tensor)
    return count / (time.perf_counter() - start)


def wrapper_cost(count: int) -> float:
    """Microseconds the recording adds to one ``all_reduce`` call, with a no-op in place of
    torch's function: the wrapper alone, free of the collective's own noise."""
    from harness.rank import recording
    from harness.rank.recording import describe

    spec = describe.spec("all_reduce", dist.all_reduce.__harness_traced__)
    tensor = torch.ones(1)

    def noop(*args: object, **kwargs: object) -> None:
        return None

    best = float("inf")
    for _ in range(5):
        with recording.Recorder() as recorder:
            start = time.perf_counter()
            for _ in range(count):
                recorder.call(spec, noop, (tensor,), {})
            recorded = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(count):
            noop(tensor)
        plain = time.perf_counter() - start
        best = min(best, (recorded - plain) / count * 1e6)
    return best


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--collectives", type=int, default=10000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args(argv)

    import bench_trace as me  # by module name: the ranks import it, not __main__

    import harness

    load = os.getloadavg()[0]
    print(
        f"bench_trace: gloo, torch {torch.__version__}, Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load average {load:.1f} at start"
    )
    print()
    print("| world size | collectives/s without tracing | with tracing | cost per collective |")
    print("|---|---|---|---|")
    wrapper_us = 0.0
    for size in sorted({1, args.world_size}):
        with harness.World(size, backend="gloo", timeout=600) as world:
            rows = []
            for traced in (False, True) * 3:  # interleaved, so load hits both: the best of 3
                rates = world.run(me.rate, args=(args.collectives, traced))
                rows.append((traced, min(rates)))
            plain = max(r for t, r in rows if not t)
            traced_rate = max(r for t, r in rows if t)
            cost_us = (1 / traced_rate - 1 / plain) * 1e6
            print(f"| {size} | {plain:,.0f} | {traced_rate:,.0f} | {cost_us:+.1f} us |")
            if size == 1:
                wrapper_us = world.run(me.wrapper_cost, args=(20000,))[0]
    print()
    print(
        f"recording wrapper alone (a no-op in place of torch's all_reduce, best of 5 x 20000): "
        f"{wrapper_us:.2f} us per collective"
    )
    print()
    print(
        f"| body (world size {args.world_size}) | World.run, check off | check on | "
        "check's cost per call |"
    )
    print("|---|---|---|---|")
    with harness.World(args.world_size, backend="gloo", timeout=600) as world:
        for count in (0, 1, 10, 100):
            calls = args.calls if count < 100 else max(args.calls // 3, 5)
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(5):
                world.run(me.all_reduces, args=(count,))
            for _ in range(calls):
                for check in (False, True):
                    start = time.perf_counter()
                    world.run(me.all_reduces, args=(count,), check_collectives=check)
                    times[check].append(time.perf_counter() - start)
            off, on = _median_ms(times[False]), _median_ms(times[True])
            print(
                f"| {count} all_reduce | {off:.3f} ms | {on:.3f} ms | {(on - off) * 1000:+.0f} us |"
            )
    print()
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
