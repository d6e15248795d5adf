"""The messages a controller and its ranks exchange, one class each.

A rank's duplex pipe carries ``Call`` (answered by ``Done``, ``Failed`` or ``Skipped``; before
that, a failing pytest body sends ``Failing`` and an acting fault ``Fired``) and ``Regroup``
(answered by ``Ready``, which also answers the rank's start, or ``Failed``). User objects
travel pre-pickled as ``bytes``: a failure to (un)pickle them is reported by the side that
saw it, naming the object.

Stopping (closing the rank's lifeline, which its watchdog thread reads), stack dumps
(``STACKS_SIGNAL``) and traces (``TRACE_REQUEST``, read from the rank's files) need no
message: they work while the main thread is blocked in a collective or a sleep, where a
Python signal handler would never run.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from harness.protocol.failures import RankFailure
from harness.protocol.schedules import Schedule
from harness.protocol.traces import Fingerprint, RankTrace

STACKS_SIGNAL = signal.SIGUSR1
"""The signal on which a rank dumps every thread's stack into its ``stacks`` file."""

TRACE_REQUEST = b"trace"
"""Written on a rank's lifeline: the rank's watchdog thread writes into its ``trace`` file what
the call in progress has issued so far (between calls: what the last call issued)."""


PRELOAD_VARIABLE = "HARNESS_PRELOAD"
"""Set in the forkserver's environment alone: the project's warm-up entries (ini
``dist_preload``), comma-separated, for :mod:`harness.rank.preload`."""

PRELOAD_REPORT = "HARNESS_PRELOAD_REPORT"
"""Set beside :data:`PRELOAD_VARIABLE`: the file the server writes each failed entry to."""

GPUS_PER_RANK = "HARNESS_GPUS_PER_RANK"
"""Set in the ranks of a world that holds ``N`` whole GPUs per rank: ``N``. Rank ``r``'s are
``cuda:r`` to ``cuda:r + N - 1`` of its ``CUDA_VISIBLE_DEVICES`` (see
:mod:`harness.protocol.devices`)."""


@dataclass(frozen=True)
class RankSetup:
    """What a rank is told when it starts (the process argument, not a pipe message).

    Attributes:
        backend: Resolved (``"gloo"`` or ``"nccl"``), never ``"auto"``.
        init: Whether the rank makes the default process group when it starts; without
            (``World(init=False)``) each call brings its own rendezvous (``Call.rendezvous``).
        inherited: The controller's ``os.environ`` at the rank's start (a forked rank would
            see the forkserver's, frozen when that server started).
        env: The rank's torchrun variables, set over ``inherited``.
        workdir: The world generation's private directory.
        coverage: The controller's coverage options and ``"config_file"``, for the rank's own
            ``coverage.Coverage``; None when the controller is not measured.
    """

    rank: int
    world_size: int
    backend: str
    init: bool
    inherited: dict[str, str]
    env: dict[str, str]
    workdir: str
    coverage: dict[str, Any] | None


OUTPUT_INHERIT = "inherit"
OUTPUT_CAPTURE = "capture"
OUTPUT_PREFIX = "prefix"
OUTPUTS = (OUTPUT_INHERIT, OUTPUT_CAPTURE, OUTPUT_PREFIX)
"""Where a rank's output goes during a call (``CallOptions.output``)."""


@dataclass(frozen=True)
class CallOptions:
    """How one call runs: decided once by whoever makes it, the same for every rank.

    Attributes:
        timeout: Bound in seconds on the call; None: the world's own bound.
        output: Where the rank's fd 1 and 2 go during the call (:mod:`harness.rank.output`).
        seed: Seeds every random generator of the rank before the call; None leaves them.
        name: How messages name the call (``"test <node id>"``); None: ``"the call of
            <fn's qualified name>"``.
        check_collectives: Whether the ranks' collectives are compared after a call that
            returned on every rank (the desync check); they are recorded either way.
        faults: The call's ``harness.faults.Fault`` specs, every rank's.
        attempt: Which attempt of a run with restarts the call is (0: the first): its ranks
            are started for it, with ``TORCHELASTIC_RESTART_COUNT`` set to it.
        restarts: How many restarts the run has (``TORCHELASTIC_MAX_RESTARTS``).
        keep_traces: Whether a call that succeeds also brings back every rank's whole trace
            (``Outcome.traces``; ``--dist-trace-all``), asked of the ranks after it.
        schedule: Where the ranks fall behind at collective boundaries
            (:mod:`harness.protocol.schedules`); None: nowhere, and nothing is counted.
    """

    timeout: float | None = None
    output: str = OUTPUT_INHERIT
    seed: int | None = None
    name: str | None = None
    check_collectives: bool = True
    faults: tuple[Any, ...] = ()
    attempt: int = 0
    restarts: int = 0
    keep_traces: bool = False
    schedule: Schedule | None = None


@dataclass(frozen=True)
class Call:
    """Run a function on the rank.

    Attributes:
        payload: The pickled ``(fn, args, kwargs)``.
        env: What changed in the controller's ``os.environ`` since the rank started (None: a
            removed variable), set under the rank's own torchrun variables for this call.
        rendezvous: Without a harness group (``World(init=False)``), the call's own
            ``MASTER_PORT`` and ``INIT_METHOD`` (``file://``, a new file), set for this call
            only, so that its ``env://`` or ``INIT_METHOD`` rendezvous meets its ranks alone.
        check_leaks: Whether the rank looks for what the call leaves behind (``Done.leaks``):
            the world's setting, not the call's.
        memory_growth: Bytes of resident memory that may stay over the rank's latest calls
            before that growth is among the leaks (0: no look, as without ``check_leaks``);
            the world's setting.
    """

    payload: bytes
    options: CallOptions = CallOptions()
    env: dict[str, str | None] | None = None
    rendezvous: dict[str, str] | None = None
    check_leaks: bool = True
    memory_growth: int = 0


@dataclass(frozen=True)
class Regroup:
    """Make a fresh default process group on the ``FileStore`` at ``store`` (a new file).

    Sent to every rank after a call that destroyed the harness's default group on every rank.
    """

    store: str


def megabytes(size: int) -> str:
    """How an amount of memory in bytes reads in messages (``512.0 MiB``)."""
    return f"{size / 2**20:.1f} MiB"


@dataclass(frozen=True)
class MemoryUse:
    """A rank's memory as it came up, or after a call once freed memory was given back.

    Attributes:
        resident: Its resident set size, in bytes.
        peak: The largest resident set size it has had since it started, in bytes.
        cuda_allocated: ``torch.cuda.memory_allocated()`` on its device, where CUDA is in use
            (else None).
        cuda_reserved: ``torch.cuda.memory_reserved()`` there (None alike).
    """

    resident: int
    peak: int
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None


@dataclass(frozen=True)
class Ready:
    """The rank is up (with its default group, if its world has one), or after ``Regroup``
    its fresh default group is.

    Attributes:
        main_thread: Ident of the rank's main thread (listed first in its stacks).
        watchdog_thread: Ident of the harness's watchdog thread (left out of its stacks).
        code_dir: Directory of the rank-side harness code in that process (maybe another copy
            than the controller's): outermost frames there are left out of its stacks.
        memory: Its memory now (None where the platform does not say).
    """

    main_thread: int
    watchdog_thread: int
    code_dir: str
    memory: MemoryUse | None = None


@dataclass(frozen=True)
class Done:
    """The call returned.

    Attributes:
        value: The pickled return value.
        reusable: False when the call left the rank unfit for another call (a collective
            raised and the call went on: its group may be broken); the world is rebuilt.
        group_count: The rank's process-group counter: ranks whose counters differ
            (``new_group`` called on some ranks only) could not meet in their next group.
        grouped: Whether the harness's default group is still the rank's default group
            (False without one). Destroyed on every rank: ``Regroup``; on some: rebuilt.
        leaks: What the call left running or open, one line each (:mod:`harness.rank.leaks`);
            empty when nothing, or when the call did not ask.
        collectives: The fingerprint of the call's collectives, when it asked, else None.
        output_written: False when the call's output was captured and it wrote none: the
            controller then does not read the capture files.
        unfired: Each strict fault of this rank that never fired, as its error's line.
        trace: The call's whole trace when it asked (``CallOptions.keep_traces``), else None.
        memory: The rank's memory after the call (None where the platform does not say).
    """

    value: bytes
    reusable: bool = True
    group_count: int = 0
    grouped: bool = True
    leaks: tuple[str, ...] = ()
    collectives: Fingerprint | None = None
    output_written: bool = True
    unfired: tuple[str, ...] = ()
    trace: RankTrace | None = None
    memory: MemoryUse | None = None


@dataclass(frozen=True)
class Failed:
    """The call or the rank's start-up raised; the rank exits right after sending it.

    Attributes:
        at: ``time.monotonic()`` when it was caught (shared by a machine's processes: the
            controller tells which rank failed first).
        trace: The collectives the call had issued (None for a failed start-up).
        fault: Whether what was raised is the error an injected fault raised (``Fired``).
    """

    failure: RankFailure
    at: float
    trace: RankTrace | None = None
    fault: bool = False


@dataclass(frozen=True)
class Fired:
    """A fault of the call acts on this rank (sent before it does: a killed rank cannot).

    Attributes:
        index: The fault's index in ``CallOptions.faults``.
        what: What it did, e.g. ``"killed (SIGKILL) before collective #3 (all_reduce) on
            the default group"``.
        ends: Whether the rank ends there for the call (killed, exited, hung): the
            controller stops waiting for it, and its peers are the call's verdict.
        at, trace: As in ``Failed``.
        number, op, site, origin: The collective it acts at, as ``FaultFired`` holds them.
    """

    index: int
    what: str
    at: float
    ends: bool
    trace: RankTrace | None = None
    number: int = 0
    op: str = ""
    site: str = ""
    origin: str = ""


@dataclass(frozen=True)
class Failing:
    """A pytest test's body or a rank-side fixture's setup raised (fields as in ``Failed``).

    Sent before the rank tears down the fixtures already set up, which may take long. The
    controller takes it as the rank's ``Failed`` (the first to fail is the root cause, and
    the peers' grace period starts); the ``Failed`` that follows replaces it, keeping ``at``.
    """

    failure: RankFailure
    at: float
    trace: RankTrace | None = None


@dataclass(frozen=True)
class Skipped:
    """The call raised a skip exception.

    Attributes:
        kind: ``"pytest"`` or ``"unittest"``.
        at, trace: As in ``Failed``.
        phase: ``"setup"`` when a rank-side fixture skipped (``PHASE_ATTR``), else ``"call"``.
        site: The file and line of the user's innermost frame (the ``pytest.skip()`` call), as
            pytest reports a skip; None where no such frame was found.
        memory: As in ``Done``.
    """

    reason: str
    kind: str
    at: float
    phase: str = "call"
    trace: RankTrace | None = None
    site: tuple[str, int] | None = None
    memory: MemoryUse | None = None


RankMessage = Ready | Done | Failing | Failed | Fired | Skipped
"""Everything a rank sends."""
