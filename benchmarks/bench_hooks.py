"""What recording collectives through torch's process-group hooks costs (torch >= 2.14).

Run by hand, never in CI (nothing here asserts on time)::

    python benchmarks/bench_hooks.py [--collectives 5000] [--rounds 7] [--steps 300] [--calls 300]
    python benchmarks/bench_hooks.py --flight-recorder [--collectives 5000] [--rounds 7]
    valgrind --tool=cachegrind --cache-sim=no python benchmarks/bench_hooks.py \
        --count functional --variant on --n 2000

One reused ``harness.World`` (Gloo) per world size (1 and ``--world-size``). Inside each rank,
during a call (the harness's recorder active), a loop of ``--collectives`` collectives on a
1-element tensor is timed by the rank itself, per collective, in each of these variants:

* ``dist.all_reduce``, the harness's wrapper recording it:

  * **plain torch**: the function the wrapper wraps (what ``dist.all_reduce`` is outside the
    harness), the harness's hooks taken off the default group;
  * **wrapper only**: ``dist.all_reduce`` with the hooks off: the recorder as it was before
    the hooks (and as it is on torch < 2.14);
  * **wrapper + hooks**: ``dist.all_reduce`` with the hooks on: torch calls them around the
    collective, and they leave it to the wrapper (one record);

* a functional ``all_reduce`` (``_functional_collectives``, then ``wait_tensor``), which only
  the hooks see on torch >= 2.14 (on older torch, the functional wrappers):

  * **plain torch**: the hooks off (on torch < 2.14: the unwrapped function);
  * **recorded**: the hooks on (on torch < 2.14: the functional wrapper).

The hooks are taken off and put back by the benchmark itself
(``harness.rank.recording.hooks.detach`` / ``attach`` on the default group, private names of
the harness): the same torch, process, group and loop measured both ways, interleaved round
by round so that load that comes and goes hits every variant alike; each variant's figure is
its best round (the least disturbed). Comparing against torch 2.13 instead would change
torch itself along with the hooks.

With ``--flight-recorder``, instead: where torch has no process-group hooks (< 2.14), what
torch's flight recorder costs, the only one to see DDP's collectives there (on by default
from torch 2.13; the harness's ranks turn it on where it is off by default): world size 1,
a fresh ``World`` per setting, ``TORCH_FR_BUFFER_SIZE=0`` (off) against ``2000`` (on),
``dist.all_reduce``, a functional ``all_reduce`` and a DDP step, best of ``--rounds``.

With ``--count WORKLOAD --variant VARIANT --n N``, instead: N collectives in this process
alone (a world of one made here, no ``harness.World``), for a run under
``valgrind --tool=cachegrind --cache-sim=no``: the difference of two variants' instruction
counts over N is per collective, whatever the machine's load. WORKLOAD is ``all_reduce``
(``dist.all_reduce``), ``functional`` or ``ddp`` (a step); VARIANT ``plain`` (no recorder
active), ``off`` (recorder, no hooks), ``empty`` (two hooks that do nothing) or ``on``.

Then, at both world sizes, a DDP training step (``Linear(4, 2)``, one bucket: one gradient
all-reduce per ``backward``, recorded only by the hooks), ``--steps`` steps per round, hooks
off and on; and, at ``--world-size``, what a call that issues no collective pays:
``World.run`` of an empty body, median of ``--calls`` calls, with the hooks off and on,
interleaved in blocks of 10.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

VARIANTS = ("plain", "wrapper", "wrapper+hooks", "funcol plain", "funcol recorded")


def hooks_available() -> bool:
    """Whether this torch has process-group hooks (in a rank or the controller)."""
    from harness import compat

    return compat.collective_hooks_available()


def set_hooks(on: bool) -> int:
    """In a rank: put the harness's hooks on the default group or take them off; how many
    groups have them now."""
    from harness.rank.recording import hooks

    group = dist.group.WORLD
    if on:
        hooks.attach(group)
    else:
        hooks.detach(group)
    return hooks.attached()


def _loop(variant: str) -> Callable[[torch.Tensor], Any]:
    import torch.distributed._functional_collectives as funcol

    if variant in ("plain", "wrapper", "wrapper+hooks"):
        fn = dist.all_reduce
        if variant == "plain":
            fn = getattr(fn, "__harness_traced__", fn)
        return fn
    reduce = funcol.all_reduce
    if variant == "funcol plain":
        reduce = getattr(reduce, "__harness_traced__", reduce)

    def functional(tensor: torch.Tensor) -> Any:
        return funcol.wait_tensor(reduce(tensor, "sum", dist.group.WORLD))

    return functional


def per_collective(variant: str, count: int) -> float:
    """In a rank: microseconds per collective of ``variant`` over ``count`` of them."""
    hooked = variant in ("wrapper+hooks", "funcol recorded")
    set_hooks(hooked and hooks_available())
    fn = _loop(variant)
    tensor = torch.ones(1)
    for _ in range(50):  # warm-up
        fn(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(count):
        fn(tensor)
    elapsed = time.perf_counter() - start
    set_hooks(hooks_available())
    return elapsed / count * 1e6


def ddp_steps(steps: int, hooked: bool) -> float:
    """In a rank: microseconds per DDP training step (forward, backward: one gradient
    all-reduce), the hooks on or off."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(4, 2))
    batch = torch.ones(3, 4)
    for _ in range(5):  # warm-up: DDP rebuilds its buckets after the first step
        model(batch).sum().backward()
    set_hooks(hooked and hooks_available())
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        model(batch).sum().backward()
    elapsed = time.perf_counter() - start
    set_hooks(hooks_available())
    return elapsed / steps * 1e6


def noop() -> None:
    """The body of a call that issues no collective."""


def _best(world: Any, rounds: int, runs: Callable[[Any, str], float]) -> dict[str, float]:
    found: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            found[variant].append(runs(world, variant))
    return {variant: min(values) for variant, values in found.items()}


def flight_recorder(args: argparse.Namespace) -> None:
    """Print what torch's flight recorder costs per collective (``--flight-recorder``)."""
    import bench_hooks as me

    import harness

    found: dict[str, dict[str, list[float]]] = {"0": {}, "2000": {}}
    for _ in range(args.rounds):
        for size in found:
            os.environ["TORCH_FR_BUFFER_SIZE"] = size  # the ranks inherit it
            with harness.World(1, backend="gloo", timeout=600) as world:
                for variant in ("wrapper", "funcol recorded"):
                    value = world.run(me.per_collective, args=(variant, args.collectives))[0]
                    found[size].setdefault(variant, []).append(value)
                step = world.run(me.ddp_steps, args=(args.steps, True))[0]
                found[size].setdefault("ddp", []).append(step)
    del os.environ["TORCH_FR_BUFFER_SIZE"]
    print("| flight recorder | dist.all_reduce | functional all_reduce | DDP step |")
    print("|---|---|---|---|")
    best = {size: {k: min(v) for k, v in found[size].items()} for size in found}
    for size, label in (("0", "off (0)"), ("2000", "on (2000)")):
        row = best[size]
        print(
            f"| {label} | {row['wrapper']:.1f} | {row['funcol recorded']:.1f} | {row['ddp']:.1f} |"
        )
    cost = {k: best["2000"][k] - best["0"][k] for k in best["0"]}
    print(
        f"| cost | {cost['wrapper']:+.1f} | {cost['funcol recorded']:+.1f} | {cost['ddp']:+.1f} |"
    )


def count(workload: str, variant: str, n: int) -> None:
    """Issue ``n`` collectives of ``workload`` here, in ``variant`` (``--count``)."""
    import contextlib

    import torch.distributed._functional_collectives as funcol
    from torch.nn.parallel import DistributedDataParallel as DDP

    from harness import compat
    from harness.rank import recording
    from harness.rank.recording import hooks, recorder

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    recorder.install()  # the wrapper alone: each variant adds its hooks itself
    group, tensor = dist.group.WORLD, torch.ones(1)
    model, batch = DDP(torch.nn.Linear(4, 2)), torch.ones(3, 4)
    loops: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: dist.all_reduce(tensor),
        "functional": lambda: funcol.wait_tensor(funcol.all_reduce(tensor, "sum", group)),
        "ddp": lambda: model(batch).sum().backward(),
    }
    if variant == "on":
        hooks.install()
    elif variant == "empty":
        compat.add_collective_hooks(group, hooks.HOOK_ID, lambda args: None, lambda args: None)
    with contextlib.nullcontext() if variant == "plain" else recording.Recorder():
        for _ in range(n):
            loops[workload]()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--collectives", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--flight-recorder", action="store_true")
    parser.add_argument("--count", choices=("all_reduce", "functional", "ddp"))
    parser.add_argument("--variant", choices=("plain", "off", "empty", "on"), default="on")
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.count:
        count(args.count, args.variant, args.n)
        return 0

    import bench_hooks as me  # by module name: the ranks import it, not __main__

    import harness

    hooked = hooks_available()
    started = time.perf_counter()
    print(
        f"bench_hooks: gloo, torch {torch.__version__}, Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
        f"process-group hooks: {'yes' if hooked else 'no (torch < 2.14)'}"
    )
    print()
    if args.flight_recorder:
        print("us per collective (a DDP step: per step), world size 1")
        flight_recorder(args)
        print(f"load average {os.getloadavg()[0]:.1f} at end")
        return 0
    print("us per collective, best of", args.rounds, "rounds of", args.collectives)
    print()
    print(
        "| world size | all_reduce: plain torch | wrapper only | wrapper + hooks | "
        "hooks' cost over wrapper only | functional: plain torch | recorded | recording's cost |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def runs(world: Any, variant: str) -> float:
        return max(world.run(me.per_collective, args=(variant, args.collectives)))

    ddp: dict[int, tuple[float, float]] = {}
    for size in sorted({1, args.world_size}):
        with harness.World(size, backend="gloo", timeout=600) as world:
            best = _best(world, args.rounds, runs)
            steps: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.rounds):
                for on in (False, True):
                    steps[on].append(max(world.run(me.ddp_steps, args=(args.steps, on))))
            ddp[size] = (min(steps[False]), min(steps[True]))
        hooks_cost = best["wrapper+hooks"] - best["wrapper"] if hooked else float("nan")
        print(
            f"| {size} | {best['plain']:.1f} | {best['wrapper']:.1f} | "
            f"{best['wrapper+hooks']:.1f} | {hooks_cost:+.1f} | {best['funcol plain']:.1f} | "
            f"{best['funcol recorded']:.1f} | "
            f"{best['funcol recorded'] - best['funcol plain']:+.1f} |"
        )
    print()
    for size, (off, on_) in ddp.items():
        print(
            f"DDP step (world size {size}, best of {args.rounds} rounds of {args.steps}): "
            f"hooks off {off:.1f} us, on {on_:.1f} us ({on_ - off:+.1f} us: its one gradient "
            "all-reduce recorded)"
        )
    with harness.World(args.world_size, backend="gloo", timeout=600) as world:
        calls: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(5):
            world.run(me.noop)
        for _ in range(max(args.calls // 10, 1)):
            for on in (False, True):
                world.run(me.set_hooks, args=(on and hooked,))
                for _ in range(10):
                    start = time.perf_counter()
                    world.run(me.noop)
                    calls[on].append(time.perf_counter() - start)
        world.run(me.set_hooks, args=(hooked,))
        off_ms = statistics.median(calls[False]) * 1000
        on_ms = statistics.median(calls[True]) * 1000
        print(
            f"World.run(empty body), world size {args.world_size}, median of "
            f"{len(calls[True])}: hooks off {off_ms:.3f} ms, on {on_ms:.3f} ms "
            f"({(on_ms - off_ms) * 1000:+.0f} us)"
        )
    print()
    print(
        f"load average {os.getloadavg()[0]:.1f} at end, "
        f"{time.perf_counter() - started:.0f} s in all"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
