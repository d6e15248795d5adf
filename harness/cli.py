"""The command line, ``python -m harness check``.

It runs every collective kind on a fresh world and reports, as a user does first on a new
machine or CI runner.

:func:`main` starts a :class:`~harness.World` the way the harness always does, asks every rank
:func:`~harness.rank.check_rows.rank_info` (its device, and whether torch can use numpy
there), then sends it :func:`~harness.rank.check_rows.check_row` once per row: each
collective once per mode (blocking, and ``async_op=True`` with ``Work.wait()``), its result
checked exactly on every rank. The ranks' answers are merged (:func:`merge_rows`) into one
table row per collective, with the slowest rank's latency.

It never hangs: each row is its own call with its own timeout (``--timeout``), so a
collective that raises on some ranks only, hangs or crashes a rank is that row's ``FAIL``,
the world is rebuilt and the next rows run. A collective the backend does not implement is
``unsupported``, which is no failure; nor is ``n/a``.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence

with warnings.catch_warnings():
    # Where torch cannot use numpy, its import warns "Failed to initialize NumPy: ...". The
    # check's report says so itself, with what to do about it (and the forkserver, which
    # shares this stderr, keeps quiet too: harness.rank.server).
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    import torch

from harness import validate
from harness.controller import forkserver, gpus
from harness.controller.backends import resolve_backend
from harness.controller.gpus import Lease
from harness.controller.world import World
from harness.errors import DistributedError, RankError, WorldHang, WorldTimeout
from harness.protocol.failures import ranks_phrase
from harness.protocol.messages import CallOptions
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

SHARING_BACKENDS = ("auto", "nccl")
"""The backends ``--ranks-per-gpu`` above 1 goes with."""

DEFAULT_ROW_TIMEOUT_S = 30.0
"""Default ``--timeout``: a healthy row takes milliseconds; this leaves room for a loaded
machine and a slow first collective (NCCL sets up its communicator there)."""

_SEVERITY = {FAIL: 3, UNSUPPORTED: 2, NOT_APPLICABLE: 1, OK: 0}
"""How bad each kind of status is: the merged row shows the worst."""


def status_kind(status: str) -> str:
    """The kind of a ``Row.status``.

    It is the part before the first colon (``"ok"``, ``"FAIL"``, ``"unsupported"`` or
    ``"n/a"``), or ``"FAIL"`` for anything else (a status this module does not know cannot be
    trusted to mean success).
    """
    head = status.split(":", 1)[0].strip()
    return head if head in _SEVERITY else FAIL


def merge_rows(per_rank: Sequence[Sequence[Row]]) -> list[Row]:
    """Merge every rank's rows into one row per collective.

    The rows come by rank; the result is in rank 0's order (then any names only later ranks
    reported).

    A collective is ok only if it is ok on every rank. Otherwise the row shows the worst
    status (FAIL, then unsupported, then n/a) of the lowest rank that has it, naming that
    rank; ranks that disagree about a non-failure status (ok on one rank, unsupported on
    another) are a failure, and so is a row missing on some rank. The latency is the
    slowest rank's.
    """
    by_rank = [{row.name: row for row in rows} for rows in per_rank]
    names = dict.fromkeys(row.name for rows in per_rank for row in rows)
    return [_merge_one(name, [rows.get(name) for rows in by_rank]) for name in names]


def _merge_one(name: str, reports: list[Row | None]) -> Row:
    latency = max(
        (row.latency_ms for row in reports if row and row.latency_ms is not None), default=None
    )
    missing = [rank for rank, row in enumerate(reports) if row is None]
    if missing:
        return Row(name, f"{FAIL}: not reported by {ranks_phrase(missing)}", latency)
    statuses = [row.status for row in reports if row is not None]
    worst = max(_SEVERITY[status_kind(status)] for status in statuses)
    culprits = [
        rank for rank, status in enumerate(statuses) if _SEVERITY[status_kind(status)] == worst
    ]
    first, status = culprits[0], statuses[culprits[0]]
    if status_kind(status) == FAIL:
        detail = status.split(":", 1)[1].strip() if ":" in status else status
        also = f" (also failed on {ranks_phrase(culprits[1:])})" if culprits[1:] else ""
        return Row(name, f"{FAIL}: rank {first}: {detail}{also}", latency)
    fine = [rank for rank in range(len(statuses)) if rank not in culprits]
    if fine:
        agreed = f"{ranks_phrase(fine)} {statuses[fine[0]]}"
        status = f"{FAIL}: ranks disagree: {agreed}, rank {first} {status}"
    return Row(name, status, latency)


def exit_code(rows: Sequence[Row]) -> int:
    """1 if a merged row failed, else 0.

    ``unsupported`` and ``n/a`` are not failures.
    """
    return 1 if any(status_kind(row.status) == FAIL for row in rows) else 0


def summary(rows: Sequence[Row]) -> str:
    """The report's last line.

    It reads ``"all N collectives ok"`` (``"1 collective ok"``; noting how many were
    unsupported or n/a) when nothing failed, else ``"K problems: name, ..."``.
    """
    kinds = [status_kind(row.status) for row in rows]
    failed = [row.name for row, k in zip(rows, kinds, strict=True) if k == FAIL]
    if failed:
        return f"{len(failed)} problem{'s' if len(failed) > 1 else ''}: {', '.join(failed)}"
    notes = [f"{kinds.count(k)} {k}" for k in (UNSUPPORTED, NOT_APPLICABLE) if k in kinds]
    ok = kinds.count(OK)
    counted = "1 collective ok" if ok == 1 else f"all {ok} collectives ok"
    return counted + (f" ({', '.join(notes)})" if notes else "")


def format_table(rows: Sequence[Row]) -> str:
    """Rows as a fixed-width ``collective | result | latency`` table.

    The header and rule are included, without a trailing newline.
    """
    cells = [("collective", "result", "latency")] + [
        (row.name, row.status, "-" if row.latency_ms is None else f"{row.latency_ms:.3f} ms")
        for row in rows
    ]
    widths = [max(len(cell[i]) for cell in cells) for i in range(3)]
    lines = [
        f"{a:<{widths[0]}} | {b:<{widths[1]}} | {c:>{widths[2]}}".rstrip() for a, b, c in cells
    ]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


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
        "--ranks-per-gpu",
        type=validate.argparse_type(validate.positive_int, "--ranks-per-gpu"),
        default=1,
        metavar="K",
        help="NCCL ranks that share one GPU: the world of N ranks leases ceil(N / K) GPUs, "
        "rank r on the (r %% G)-th, with NCCL_MULTI_RANK_GPU_ENABLE=1 (needs NCCL >= 2.30; "
        "default: 1, a GPU per rank, none leased)",
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
    """Entry point of ``python -m harness``; ``argv`` defaults to ``sys.argv[1:]``.

    Returns:
        0 if every collective was ok (or unsupported / n/a); 1 if one failed (raised, timed
        out, crashed a rank or gave a wrong result) or the world broke; 2 if the world
        cannot be started here; 130 on Ctrl-C.

    Raises:
        SystemExit: From argparse, for ``--help`` or a usage error (exit code 2).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.ranks_per_gpu > 1 and args.backend not in SHARING_BACKENDS:
        parser.error(
            f"--ranks-per-gpu {args.ranks_per_gpu} shares GPUs between NCCL ranks, but the "
            f"backend is {args.backend!r}: use --backend nccl, or --ranks-per-gpu 1"
        )
    try:
        if args.ranks_per_gpu > 1:
            lease = _lease(args.world_size, args.backend, args.ranks_per_gpu, args.timeout)
            if isinstance(lease, str):
                _say(lease)
                return 2
            return _check(args.world_size, args.backend, args.timeout, args.repeats, lease)
        return _check(args.world_size, args.backend, args.timeout, args.repeats)
    except KeyboardInterrupt:
        # The World has already stopped its ranks (World.call and close run on the way out).
        print("interrupted", file=sys.stderr)
        return 130


def _lease(world_size: int, backend: str, ranks_per_gpu: int, timeout: float) -> Lease | str:
    """The GPUs a world whose ranks share them leases: ``ceil(world_size / ranks_per_gpu)``
    of those CUDA shows, taken as the plugin takes them (exclusive of every pytest run's).

    Returns:
        The lease, or why there is none (no NCCL here, too few GPUs, or they stayed taken).
    """
    if resolve_backend(backend) != "nccl":
        return "--ranks-per-gpu needs the NCCL backend, and CUDA shows no GPU here"
    count = -(-world_size // ranks_per_gpu)

    def shown() -> int:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    stock = gpus.inventory(None, os.environ, shown, gpus.default_lease_dir())
    if len(stock.ids) < count:
        return (
            f"{world_size} ranks, {ranks_per_gpu} per GPU, need {count} "
            f"{'GPU' if count == 1 else 'GPUs'}; CUDA shows {len(stock.ids)}"
        )
    try:
        return gpus.acquire(stock, count, holder="python -m harness check", timeout=timeout)
    except gpus.LeaseError as exc:
        return str(exc)


def _check(
    world_size: int, backend: str, timeout: float, repeats: int, lease: Lease | None = None
) -> int:
    """Start the world, run the rows, print the report; ``lease``: its GPUs (ranks that
    share them), which the World gives back when it closes.

    Returns the exit code.
    """
    try:
        world = World(world_size, backend=backend, gpus=lease)
    except RuntimeError as exc:
        # An unavailable backend (NCCL without CUDA devices, a backend torch lacks).
        gloo = backend != "gloo" and lease is None  # sharing GPUs is NCCL's alone
        _say(f"{exc}; try --backend gloo" if gloo else str(exc))
        return 2
    except DistributedError as exc:
        _say(str(exc))
        return 1
    try:
        try:
            infos: list[RankInfo] = world.run(rank_info, timeout=timeout)
        except DistributedError as exc:
            _say(str(exc))
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
        _say(f"{name}: {text}\n")
    if no_numpy is not None:
        _say(
            f"torch cannot use numpy in the ranks ({_numpy_problems(infos)}); the object "
            "collectives need it: pip install numpy"
        )
    sys.stderr.flush()
    print(format_table(rows))
    print(summary(rows))
    return exit_code(rows)


def _say(text: str) -> None:
    print(f"harness check: {text}", file=sys.stderr)


def _numpy_status(infos: Sequence[RankInfo]) -> str | None:
    """The object collectives' status where a rank lacks numpy.

    It applies where torch cannot use numpy on some rank, else None. It is decided once for
    every rank (the rows then never run), as torch would raise on the receiving ranks only,
    and no rank may enter a collective another rank skips.
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

    Returns the merged rows, and ``(row name, full error text)`` for each row whose call
    failed.
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
            outcome = world.call(check_row, kwargs=kwargs, options=CallOptions(timeout))
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
    """A one-line reason for a row whose call failed.

    The full error goes to stderr.
    """
    if isinstance(exc, WorldHang):
        return "hang: its collectives can never complete (every rank's stack is on stderr)"
    if isinstance(exc, WorldTimeout):
        return f"timeout: not done within {timeout:g} s (every rank's stack is on stderr)"
    if isinstance(exc, RankError) and exc.failures:
        first = next(iter(exc.failures.values()))
        line = f"rank {first.rank}: {first.exc_type}: {first.message.strip()}"
    else:
        line = exc.summary.strip()
    line = (line.splitlines() or [""])[0]
    return line if len(line) <= 160 else line[:157] + "..."


def _describe_devices(devices: Sequence[str]) -> str:
    unique = list(dict.fromkeys(devices))
    if len(unique) == 1:
        return unique[0]
    return ", ".join(f"rank {rank}: {device}" for rank, device in enumerate(devices))
