"""The command line, ``python -m harness check``: run every collective kind on a fresh world
and report.

It is what a user runs first on a new machine or CI runner: it starts a world the way the
harness always does, runs each collective once per mode (blocking, and ``async_op=True``
with ``Work.wait()``), checks every rank's result exactly against what it must be, and
prints one table row per collective with the slowest rank's latency.

This module is the controller side: :func:`main` starts the :class:`~harness.World`, asks
every rank :func:`~harness.rank.check_rows.rank_info` (its device, and whether torch can
use numpy there), then sends :func:`~harness.rank.check_rows.check_row` once per row (the
rank side), merges the ranks' answers (:func:`merge_rows`), prints them
(:func:`format_table`) and picks the exit code (:func:`exit_code`).

It never hangs. Each row is its own call with its own timeout (``--timeout``), so a
collective that raises on some ranks only (the world tears the others down at once), hangs
(the timeout kills the ranks) or crashes a rank is that row's ``FAIL``, the world is rebuilt
and the next rows run. The object collectives need numpy in the ranks: where torch cannot
use it on some rank, their rows are ``n/a: needs numpy`` on every rank and never run, since
torch would raise on the receiving ranks only.

A collective the backend does not implement is reported as ``unsupported`` and is not a
problem; nor is ``n/a``; a wrong result or any other exception is. Measured on torch 2.13
with Gloo on CPU, every collective checked here is implemented (``reduce_scatter`` and
``all_to_all`` included), so a plain run prints no ``unsupported`` rows there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from harness import validate
from harness.controller import forkserver
from harness.controller.world import World
from harness.errors import DistributedError, RankError, WorldTimeout
from harness.protocol.failures import ranks_phrase
from harness.rank.check_rows import (
    DEFAULT_REPEATS,
    FAIL,
    NEEDS_NUMPY,
    NOT_APPLICABLE,
    OK,
    UNSUPPORTED,
    RankInfo,
    Row,
    check_row,
    needs_numpy,
    rank_info,
    row_names,
)

DEFAULT_ROW_TIMEOUT_S = 30.0
"""Default ``--timeout``: a healthy row takes milliseconds; this leaves room for a loaded
machine and a slow first collective (NCCL sets up its communicator there)."""

_SEVERITY = {FAIL: 3, UNSUPPORTED: 2, NOT_APPLICABLE: 1, OK: 0}
"""How bad each kind of status is: the merged row shows the worst."""


def kind(status: str) -> str:
    """The kind of a status string: ``"ok"``, ``"FAIL"``, ``"unsupported"`` or ``"n/a"``.

    Args:
        status: A ``Row.status``.

    Returns:
        The part before the first colon, or ``"FAIL"`` for anything unrecognised (a status
        this module does not know cannot be trusted to mean success).
    """
    head = status.split(":", 1)[0].strip()
    return head if head in _SEVERITY else FAIL


__all__ = [
    "Row",
    "exit_code",
    "format_table",
    "main",
    "merge_rows",
    "summary",
]


def merge_rows(per_rank: Sequence[Sequence[Row]]) -> list[Row]:
    """Merge every rank's rows into one row per collective.

    A collective is ok only if it is ok on every rank. Otherwise the row shows the worst
    status (FAIL before unsupported before n/a) of the lowest rank that has it, naming that
    rank; ranks that disagree about a non-failure status (ok on one rank, unsupported on
    another) are a failure too. A row missing on some rank is a failure. The latency is
    the maximum over ranks: a collective is as slow as its slowest rank.

    Args:
        per_rank: Each rank's rows (:func:`~harness.rank.check_rows.check_row`'s), by rank.

    Returns:
        One merged ``Row`` per collective, in rank 0's order (then any names only later
        ranks reported).
    """
    names: list[str] = []
    by_rank: list[dict[str, Row]] = []
    for rows in per_rank:
        by_rank.append({row.name: row for row in rows})
        names += [row.name for row in rows if row.name not in names]
    merged = []
    for name in names:
        merged.append(
            _merge_one(name, [(rank, rows.get(name)) for rank, rows in enumerate(by_rank)])
        )
    return merged


def _merge_one(name: str, reports: list[tuple[int, Row | None]]) -> Row:
    latencies = [row.latency_ms for _, row in reports if row and row.latency_ms is not None]
    latency = max(latencies) if latencies else None
    missing = [rank for rank, row in reports if row is None]
    if missing:
        return Row(name, f"{FAIL}: not reported by {ranks_phrase(missing)}", latency)
    present = [(rank, row) for rank, row in reports if row is not None]
    worst = max(_SEVERITY[kind(row.status)] for _, row in present)
    culprits = [rank for rank, row in present if _SEVERITY[kind(row.status)] == worst]
    first = culprits[0]
    status = dict(present)[first].status
    if kind(status) == FAIL:
        detail = status.split(":", 1)[1].strip() if ":" in status else status
        others = culprits[1:]
        also = f" (also failed on {ranks_phrase(others)})" if others else ""
        return Row(name, f"{FAIL}: rank {first}: {detail}{also}", latency)
    if len(culprits) != len(present):
        fine = [rank for rank in range(len(reports)) if rank not in culprits]
        return Row(
            name,
            f"{FAIL}: ranks disagree: {ranks_phrase(fine)} {dict(present)[fine[0]].status}, "
            f"rank {first} {status}",
            latency,
        )
    return Row(name, status, latency)


def exit_code(rows: Sequence[Row]) -> int:
    """The process exit code for a merged report.

    Args:
        rows: Merged rows (see :func:`merge_rows`).

    Returns:
        0 if no row failed (``unsupported`` and ``n/a`` are not failures), otherwise 1.
    """
    return 1 if any(kind(row.status) == FAIL for row in rows) else 0


def summary(rows: Sequence[Row]) -> str:
    """The last line of the report.

    Args:
        rows: Merged rows.

    Returns:
        ``"all N collectives ok"`` (noting how many were unsupported or n/a) when nothing
        failed, otherwise ``"K problems: name, name, ..."``.
    """
    failed = [row.name for row in rows if kind(row.status) == FAIL]
    if failed:
        noun = "problem" if len(failed) == 1 else "problems"
        return f"{len(failed)} {noun}: {', '.join(failed)}"
    ok = sum(1 for row in rows if kind(row.status) == OK)
    skipped = {
        k: sum(1 for row in rows if kind(row.status) == k) for k in (UNSUPPORTED, NOT_APPLICABLE)
    }
    notes = [f"{count} {k}" for k, count in skipped.items() if count]
    return f"all {ok} collectives ok" + (f" ({', '.join(notes)})" if notes else "")


def format_table(rows: Sequence[Row]) -> str:
    """Render rows as a fixed-width ``collective | result | latency`` table.

    Args:
        rows: Merged rows.

    Returns:
        The table, header and rule included, without a trailing newline.
    """
    cells = [
        (row.name, row.status, "-" if row.latency_ms is None else f"{row.latency_ms:.3f} ms")
        for row in rows
    ]
    header = ("collective", "result", "latency")
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(2)]
    latency_width = max(len(line[2]) for line in [header, *cells])

    def line(cell: tuple[str, str, str]) -> str:
        return (
            f"{cell[0]:<{widths[0]}} | {cell[1]:<{widths[1]}} | {cell[2]:>{latency_width}}"
        ).rstrip()

    rule = f"{'-' * widths[0]}-+-{'-' * widths[1]}-+-{'-' * latency_width}"
    return "\n".join([line(header), rule, *(line(cell) for cell in cells)])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="Tools of the fhelium distributed test harness.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    check = commands.add_parser(
        "check",
        help="run every collective on a local world and report",
        description=(
            "Start a world of local ranks, run every collective kind (blocking and "
            "async_op=True), verify each rank's result exactly and print a table. Each "
            "row runs on its own, with its own timeout: one that fails or hangs is that "
            "row's FAIL and the next rows run. The object collectives need numpy (pip "
            "install numpy); without it their rows are 'n/a: needs numpy'. Exits 0 if "
            "nothing failed, 1 if a collective failed or the world broke, 2 if the world "
            "cannot start here (e.g. NCCL without enough CUDA devices)."
        ),
    )
    check.add_argument(
        "--world-size",
        type=validate.argparse_type(validate.positive_int, "world size"),
        default=2,
        metavar="N",
        help="number of ranks (default: 2)",
    )
    check.add_argument(
        "--backend",
        choices=validate.BACKEND_CHOICES,
        default="auto",
        help="process-group backend; auto means NCCL with CUDA, else Gloo (default: auto)",
    )
    check.add_argument(
        "--timeout",
        type=validate.argparse_type(validate.seconds, "timeout"),
        default=DEFAULT_ROW_TIMEOUT_S,
        metavar="SECONDS",
        help=(
            "bound on each row (one collective in one mode) and on the ranks' first answer; "
            "a row that takes longer is a FAIL and the check goes on "
            f"(default: {DEFAULT_ROW_TIMEOUT_S:g})"
        ),
    )
    check.add_argument(
        "--repeats",
        type=validate.argparse_type(validate.positive_int, "repeat count"),
        default=DEFAULT_REPEATS,
        metavar="K",
        help=f"timed repetitions per collective after a warm-up (default: {DEFAULT_REPEATS})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m harness``.

    Args:
        argv: The arguments after the program name; None reads ``sys.argv[1:]``.

    Returns:
        0 if every collective was ok (or unsupported / n/a); 1 if one failed (raised, timed
        out, crashed a rank or gave a wrong result) or the world broke; 2 if the world
        cannot be started here (argparse also exits 2 on a usage error); 130 on Ctrl-C.

    Raises:
        SystemExit: From argparse, for ``--help`` or a usage error.
    """
    args = _parser().parse_args(argv)
    try:
        return _check(args.world_size, args.backend, args.timeout, args.repeats)
    except KeyboardInterrupt:
        # The World has already stopped its ranks (World.call and close run on the way out).
        print("interrupted", file=sys.stderr)
        return 130


def _check(world_size: int, backend: str, timeout: float, repeats: int) -> int:
    """Start the world, run the rows, print the report; return the exit code."""
    try:
        world = World(world_size, backend=backend)
    except RuntimeError as exc:
        # An unavailable backend (NCCL without CUDA devices, a backend torch lacks).
        hint = "; try --backend gloo" if backend != "gloo" else ""
        print(f"harness check: {exc}{hint}", file=sys.stderr)
        return 2
    except DistributedError as exc:
        print(f"harness check: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            infos: list[RankInfo] = world.run(rank_info, timeout=timeout)
        except DistributedError as exc:
            print(f"harness check: {exc}", file=sys.stderr)
            return 1
        print(
            f"torch {torch.__version__} | backend {world.backend} | world size {world_size} | "
            f"device {_describe_devices([info.device for info in infos])} | start method "
            f"{forkserver.context().get_start_method()}",
            # Shown while the check runs, also when stdout is a pipe (CI logs).
            flush=True,
        )
        no_numpy = _numpy_status(infos)
        rows, details = _run_rows(world, repeats, timeout, no_numpy)
    finally:
        world.close()
    # Details first, so that the table and its summary end the output.
    for name, text in details:
        print(f"harness check: {name}: {text}\n", file=sys.stderr)
    if no_numpy is not None:
        print(
            f"harness check: torch cannot use numpy in the ranks "
            f"({_numpy_problems(infos)}); the object collectives need it: pip install numpy",
            file=sys.stderr,
        )
    sys.stderr.flush()
    print(format_table(rows))
    print(summary(rows))
    return exit_code(rows)


def _numpy_status(infos: Sequence[RankInfo]) -> str | None:
    """The status of the object collectives' rows when some rank lacks numpy, else None.

    Decided here, once for every rank, so that no rank enters an object collective that
    another rank skips.
    """
    missing = [rank for rank, info in enumerate(infos) if info.numpy_problem is not None]
    if not missing:
        return None
    if len(missing) == len(infos):
        return NEEDS_NUMPY
    return f"{NEEDS_NUMPY} (missing on {ranks_phrase(missing)})"


def _numpy_problems(infos: Sequence[RankInfo]) -> str:
    problems: dict[str, list[int]] = {}
    for rank, info in enumerate(infos):
        if info.numpy_problem is not None:
            problems.setdefault(info.numpy_problem, []).append(rank)
    if len(problems) == 1 and len(next(iter(problems.values()))) == len(infos):
        return next(iter(problems))
    return "; ".join(f"{ranks_phrase(ranks)}: {problem}" for problem, ranks in problems.items())


def _run_rows(
    world: World, repeats: int, timeout: float, no_numpy: str | None
) -> tuple[list[Row], list[tuple[str, str]]]:
    """Run every row as its own call.

    Returns:
        The merged rows, and ``(row name, full error text)`` for each row whose call failed.
    """
    rows: list[Row] = []
    details: list[tuple[str, str]] = []
    names = row_names()
    for index, name in enumerate(names):
        if no_numpy is not None and needs_numpy(name):
            rows.append(Row(name, no_numpy, None))
            continue
        kwargs = {"name": name, "repeats": repeats}
        try:
            # call, not run: a DistributedError raised here is about the world (it could
            # not be rebuilt after the previous row failed), not about this row.
            outcome = world.call(check_row, kwargs=kwargs, timeout=timeout)
        except DistributedError as exc:
            details.append((name, f"the world could not be restarted: {exc}"))
            rows.append(Row(name, f"{FAIL}: the world could not be restarted", None))
            rows += [Row(later, f"{FAIL}: not run", None) for later in names[index + 1 :]]
            break
        try:
            per_rank: list[Row] = outcome.result()
        except DistributedError as exc:
            details.append((name, str(exc)))
            rows.append(Row(name, f"{FAIL}: {_reason(exc, timeout)}", None))
            continue
        rows += merge_rows([[row] for row in per_rank])
    return rows, details


def _reason(exc: DistributedError, timeout: float) -> str:
    """A one-line reason for a row whose call failed (the full error goes to stderr)."""
    if isinstance(exc, WorldTimeout):
        return f"timeout: not done within {timeout:g} s (every rank's stack is on stderr)"
    if isinstance(exc, RankError) and exc.failures:
        first = next(iter(exc.failures.values()))
        line = (first.message.strip().splitlines() or [""])[0]
        return _shorten(f"rank {first.rank}: {first.exc_type}: {line}")
    return _shorten((exc.summary.strip().splitlines() or [""])[0])


def _shorten(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_devices(devices: Sequence[str]) -> str:
    unique = list(dict.fromkeys(devices))
    if len(unique) == 1:
        return unique[0]
    return ", ".join(f"rank {rank}: {device}" for rank, device in enumerate(devices))
