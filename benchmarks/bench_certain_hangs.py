"""Whether a healthy call is ever ended early as a hang that can never finish.

Run by hand, never in CI (nothing here asserts on time)::

    python benchmarks/bench_certain_hangs.py [--runs 10] [--collectives 200] [--world-size 4]

Each run is one ``harness.run`` (fresh ranks, Gloo, the default deadline) whose ranks each
issue ``--collectives`` mixed collectives, the same sequence on every rank: all-reduces
(several reduce ops), broadcasts and all-gathers from varied roots, barriers, on varied
shapes and dtypes, on the default group and on two subgroups; between them each rank spends
a little time of its own in Python, more on some ranks than on others, so that the ranks are
often blocked in a collective while a peer is still busy (what the supervisor's trace
requests then see). A run passes when every rank returns the expected sums. Run it beside
CPU hogs (``yes > /dev/null &``) to see that load alone never ends a call early. Prints one
line per run and the number that passed; the exit status is 0 only when all did.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist

import harness

DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32)
SHAPES = ((1,), (4,), (3, 5), (2, 2, 2), (64,))


def mixed(count: int, seed: int) -> float:
    """The ranks' body: ``count`` collectives chosen by ``seed`` (alike on every rank); the
    sum of every result, which is equal on every rank when all went right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    low = dist.new_group(list(range(size // 2)))
    high = dist.new_group(list(range(size // 2, size)))
    choose = torch.Generator().manual_seed(seed)
    total = 0.0
    for index in range(count):
        pick = torch.randint(0, 1 << 30, (6,), generator=choose).tolist()
        dtype = DTYPES[pick[0] % len(DTYPES)]
        shape = SHAPES[pick[1] % len(SHAPES)]
        kind = pick[2] % 5
        # Busy in Python for a while, longer on some ranks than others, at some steps.
        if pick[3] % 7 == rank % 7:
            end = time.perf_counter() + (pick[4] % 20) / 1000
            while time.perf_counter() < end:
                pass
        tensor = torch.full(shape, index % 5 + 1, dtype=dtype)
        if kind == 0:
            ops = (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN)
            dist.all_reduce(tensor, op=ops[pick[5] % len(ops)])
        elif kind == 1:
            dist.broadcast(tensor, src=pick[5] % size)
        elif kind == 2:
            out = [torch.empty_like(tensor) for _ in range(size)]
            dist.all_gather(out, tensor)
            tensor = torch.stack(out)
        elif kind == 3:
            dist.barrier()
        else:
            half = rank < size // 2
            group = low if half else high
            members = list(range(size // 2)) if half else list(range(size // 2, size))
            dist.broadcast(tensor, src=members[pick[5] % len(members)], group=group)
            # Each subgroup's results differ from the other's: make them equal again.
            dist.all_reduce(tensor)
        total += float(tensor.double().sum())
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--collectives", type=int, default=200)
    parser.add_argument("--world-size", type=int, default=4)
    args = parser.parse_args()
    passed = 0
    for run in range(args.runs):
        start = time.monotonic()
        try:
            totals = harness.run(
                mixed, world_size=args.world_size, backend="gloo", args=(args.collectives, run)
            )
        except harness.DistributedError as exc:
            print(f"run {run + 1}: FAILED after {time.monotonic() - start:.1f} s: {exc.summary}")
            for verdict in exc.verdicts:
                print(f"    {verdict}")
            continue
        ok = len(set(totals)) == 1
        passed += ok
        state = "passed" if ok else f"WRONG totals {totals}"
        print(f"run {run + 1}: {state} in {time.monotonic() - start:.1f} s")
    print(f"{passed}/{args.runs} runs passed ({args.world_size} ranks, {args.collectives} each)")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
