"""Where the time of one ``World.run`` goes, phase by phase, next to the bare workload.

Run by hand, never in CI (nothing here asserts on time)::

    python benchmarks/bench_call_phases.py [--world-size 4] [--calls 300] [--pauses 0,0.5]

One world of ``--world-size`` Gloo ranks runs ``--calls`` calls of each body (empty, and the
workload of :mod:`workload`: all_reduce of a 1-element tensor, then a barrier), with a pause
of each of ``--pauses`` milliseconds between two calls (a test suite has pytest's own work
there, and the ranks go idle meanwhile). Every process stamps each phase with
``time.monotonic_ns()`` (one clock for all processes of the machine), so a call splits into:

* ``prep``: ``World.run`` entered until the ranks' message is about to be sent (checks,
  pickling the call);
* ``send -> first rank`` / ``send -> last rank``: until the first and the last rank starts
  handling it (pipe writes, waking the ranks, unpickling the message);
* ``rank prep``: a rank's work before the body (median over ranks);
* ``body``: from the last rank entering the body until the median rank leaves it (for the
  workload, the collectives themselves, waiting for the slowest rank included);
* ``rank after``: a rank's work from the body's end until its answer is sent;
* ``answer -> controller``: the last answer sent until the controller has read it;
* ``after``: the last answer read until ``World.run`` returns (classifying the answers).

The floor is the workload alone: the same body in a loop inside one call, each iteration
timed on its rank, with the same pause before each iteration (``bare``).

``--spinner`` adds a process at ``nice 19`` that spins while everything is measured. It
takes CPU time only when no other process wants it, so what it changes is how long waking
an idle CPU takes (on a VM, an idle virtual CPU is halted, and waking it costs far more than
a wake-up on a busy one).

The phases are measured by wrapping the harness's own functions from outside (in the
controller and, through a call, in the ranks): this script reads private names of the
harness and may need updating when they move.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import workload as wl

import harness

_ns = time.monotonic_ns
_RECORDS: dict[str, list[tuple[int, int]]] = {"call": [], "body": []}


def _install() -> None:
    """In a rank: stamp the start and end of each call's handling from now on."""
    from harness.rank import loop

    for records in _RECORDS.values():
        records.clear()
    if getattr(loop._call, "stamped", False):
        return
    handle = loop._call

    def stamped(ctx: Any, call: Any) -> Any:
        start = _ns()
        reply = handle(ctx, call)
        _RECORDS["call"].append((start, _ns()))
        return reply

    stamped.stamped = True  # type: ignore[attr-defined]
    loop._call = stamped


def stamped_noop() -> None:
    """The empty body, stamped."""
    now = _ns()
    _RECORDS["body"].append((now, now))


def stamped_workload() -> None:
    """The workload, stamped."""
    start = _ns()
    wl.all_reduce_barrier()
    _RECORDS["body"].append((start, _ns()))


def _fetch() -> dict[str, list[tuple[int, int]]]:
    return {key: list(value) for key, value in _RECORDS.items()}


def bare(calls: int, pause_s: float) -> float:
    """In a rank: the workload in a loop, each iteration timed; the median in seconds."""
    times = []
    for _ in range(calls):
        if pause_s:
            time.sleep(pause_s)
        start = time.perf_counter()
        wl.all_reduce_barrier()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class ControllerStamps:
    """Stamps in this (the controller's) process: each run, each exchange, each answer read."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, int]] = []
        self.exchanges: list[int] = []
        self.answers: list[int] = []
        from harness.controller import waiting

        receive = waiting._receive

        def stamped_receive(proc: Any, ready: bool = False) -> Any:
            message = receive(proc, ready)
            self.answers.append(_ns())
            return message

        waiting._receive = stamped_receive  # type: ignore[assignment]
        # World.call reaches exchange through whichever module imported it by name.
        from harness.controller import exchange as module

        original = module.exchange

        def stamped_exchange(*args: Any, **kwargs: Any) -> Any:
            self.exchanges.append(_ns())
            return original(*args, **kwargs)

        for name, loaded in list(sys.modules.items()):
            if name.startswith("harness.") and getattr(loaded, "exchange", None) is original:
                loaded.exchange = stamped_exchange  # type: ignore[attr-defined]

    def clear(self) -> None:
        self.runs.clear()
        self.exchanges.clear()
        self.answers.clear()


PHASES = (
    "prep",
    "send -> first rank",
    "send -> last rank",
    "rank prep",
    "body",
    "rank after",
    "answer -> controller",
    "after",
    "total",
)


def measure(
    world: harness.World,
    stamps: ControllerStamps,
    fn: Callable[[], None],
    calls: int,
    pause_s: float,
) -> dict[str, float]:
    """Median microseconds of each phase over ``calls`` calls of ``fn``."""
    n = world.world_size
    world.run(_install)
    stamps.clear()
    for _ in range(calls):
        if pause_s:
            time.sleep(pause_s)
        start = _ns()
        world.run(fn)
        stamps.runs.append((start, _ns()))
    ranks = world.run(_fetch)
    phases: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for i, (start, end) in enumerate(stamps.runs):
        sent = stamps.exchanges[i]
        # The last records are this measure's calls (an earlier call may be recorded first).
        handled = [ranks[r]["call"][i - calls] for r in range(n)]
        bodies = [ranks[r]["body"][i - calls] for r in range(n)]
        last_answer = max(stamps.answers[i * n : (i + 1) * n])
        body_end = statistics.median(b[1] for b in bodies)
        for phase, value in (
            ("prep", sent - start),
            ("send -> first rank", min(h[0] for h in handled) - sent),
            ("send -> last rank", max(h[0] for h in handled) - sent),
            (
                "rank prep",
                statistics.median(b[0] - h[0] for b, h in zip(bodies, handled, strict=True)),
            ),
            # The empty body's ranks are never in it together: 0 there.
            ("body", max(0.0, body_end - max(b[0] for b in bodies))),
            (
                "rank after",
                statistics.median(h[1] - b[1] for b, h in zip(bodies, handled, strict=True)),
            ),
            ("answer -> controller", last_answer - max(h[1] for h in handled)),
            ("after", end - last_answer),
            ("total", end - start),
        ):
            phases[phase].append(value / 1e3)
    return {phase: statistics.median(values) for phase, values in phases.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4, help="ranks (4)")
    parser.add_argument("--calls", type=int, default=300, help="calls per body and pause (300)")
    parser.add_argument(
        "--pauses", default="0,0.5", help="pauses between calls, in ms, comma-separated (0,0.5)"
    )
    parser.add_argument("--spinner", action="store_true", help="a nice-19 spinner runs along")
    args = parser.parse_args(argv)
    pauses = [float(p) / 1e3 for p in args.pauses.split(",")]
    spinner = None
    if args.spinner:
        spinner = subprocess.Popen(
            [sys.executable, "-c", "import os; os.nice(19)\nwhile True: pass"]
        )
    try:
        stamps = ControllerStamps()
        columns: list[tuple[str, dict[str, float], float]] = []
        with harness.World(args.world_size, backend="gloo") as world:
            for _ in range(20):
                world.run(stamped_noop)
                world.run(stamped_workload)
            for pause in pauses:
                floor = statistics.median(world.run(bare, args=(args.calls, pause))) * 1e6
                for label, fn in (("noop", stamped_noop), ("workload", stamped_workload)):
                    phases = measure(world, stamps, fn, args.calls, pause)
                    columns.append((f"{label}, pause {pause * 1e3:g} ms", phases, floor))
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    load = os.getloadavg()[0]
    print(
        f"bench_call_phases: world size {args.world_size}, gloo, {args.calls} calls each, "
        f"{os.cpu_count()} CPUs, load average {load:.1f}"
        + (", with a nice-19 spinner" if args.spinner else "")
        + "; medians in microseconds"
    )
    header = ["phase", *(label for label, _, _ in columns)]
    rows = [[phase, *(f"{phases[phase]:.0f}" for _, phases, _ in columns)] for phase in PHASES]
    rows.append(["bare workload (floor)", *(f"{floor:.0f}" for _, _, floor in columns)])
    print(wl.table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
