"""The messages a controller and its ranks exchange, one class each.

Each rank has one duplex pipe to its controller. Everything that crosses it is one of the
classes below, so the protocol can be read here in one place:

controller -> rank
    ``Call``  run one function and answer with ``Done``, ``Failed`` or ``Skipped``.

rank -> controller
    ``Ready``    the default process group is up (answers the start of a rank).
                 It also names the rank's main and watchdog threads and where its own code
                 lives, so that its stack dumps can be made readable.
    ``Done``     the call returned; ``value`` is its pickled return value.
    ``Failed``   the call (or start-up) raised; the rank exits right after sending this, so
                 peers blocked in a collective with it fail at once instead of waiting for
                 the process-group timeout.
    ``Skipped``  the call raised a skip exception (pytest's or unittest's).

User objects travel pre-pickled as ``bytes``: the messages themselves always pickle, and a
failure to (un)pickle user data is reported by the side that saw it, naming the object.

Two things need no message. Stopping: a second pipe, the rank's lifeline, carries nothing at
all; when the controller closes it (or dies) the rank's watchdog thread saves coverage and
ends the rank, also while its main thread is stuck in a collective. Stack dumps: the
controller sends ``STACKS_SIGNAL`` and reads the dump from the rank's files
(:mod:`harness.protocol.rank_files`), which works while the rank's main thread is blocked.

A pytest test is a ``Call`` of the rank-side test runner with a ``TestRef`` and the fixture
values as arguments; ``RankValue`` marks the values only the rank can fill in.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from harness.protocol.failures import RankFailure

STACKS_SIGNAL = signal.SIGUSR1
"""The signal on which a rank dumps every thread's stack into its ``stacks`` file."""


@dataclass(frozen=True)
class RankSetup:
    """What a rank is told when it starts (the process argument, not a pipe message).

    Attributes:
        rank: Global rank.
        world_size: Number of ranks.
        backend: Resolved backend (``"gloo"`` or ``"nccl"``), never ``"auto"``.
        inherited: The controller's ``os.environ`` when the rank started. A forked rank would
            otherwise see the forkserver's environment, frozen when that server started.
        env: The rank's torchrun variables, set over ``inherited``.
        workdir: The world generation's private directory (see
            :mod:`harness.protocol.rank_files`).
        coverage: The controller's coverage options (``{"run:branch": True, ...}``) and
            ``"config_file"``, for the rank's own ``coverage.Coverage``; None when the
            controller is not measured.
    """

    rank: int
    world_size: int
    backend: str
    inherited: dict[str, str]
    env: dict[str, str]
    workdir: str
    coverage: dict[str, Any] | None


OUTPUT_INHERIT = "inherit"
OUTPUT_CAPTURE = "capture"
OUTPUT_PREFIX = "prefix"
OUTPUTS = (OUTPUT_INHERIT, OUTPUT_CAPTURE, OUTPUT_PREFIX)
"""Where a rank's output goes during a call (``Call.output``)."""


@dataclass(frozen=True)
class Call:
    """Run ``fn(*args, **kwargs)`` from the pickled ``payload`` (a ``(fn, args, kwargs)`` tuple).

    ``output`` says where the rank's stdout/stderr file descriptors go during the call:
    ``OUTPUT_CAPTURE`` to its capture files (the controller reads them afterwards, even after a
    crash), ``OUTPUT_PREFIX`` to its own streams with each line prefixed ``[rank N]``,
    ``OUTPUT_INHERIT`` nowhere else.
    ``env`` is how the controller's ``os.environ`` now differs from the one the rank started
    with (a fixture's ``monkeypatch.setenv``, pytest's ``PYTEST_CURRENT_TEST``): each changed
    variable with its new value, None for one that was removed. The call sees the change,
    under the rank's own torchrun variables, and the rank's environment is restored afterwards.
    Only the change travels: setting a whole environment costs milliseconds per call.
    ``seed``, when given, seeds every random generator of the rank before the call (torch
    CPU and CUDA, ``random``, numpy's global one), so that it draws what a fresh process
    seeded alike would.
    ``check_leaks``: whether the rank looks for what the call leaves behind (threads,
    child processes, open files; see ``Done.leaks``).
    """

    payload: bytes
    output: str = OUTPUT_INHERIT
    env: dict[str, str | None] | None = None
    seed: int | None = None
    check_leaks: bool = True


@dataclass(frozen=True)
class Ready:
    """The rank's default process group is initialized.

    Attributes:
        main_thread: Ident of the rank's main thread (listed first in its stacks).
        watchdog_thread: Ident of the harness's watchdog thread (left out of its stacks).
        code_dir: Directory of the rank-side harness code in that process; outermost frames
            there are left out of its stacks (the rank may run another copy of the package
            than the controller, such as a source checkout beside an install).
    """

    main_thread: int
    watchdog_thread: int
    code_dir: str


@dataclass(frozen=True)
class Done:
    """The call returned normally.

    ``reusable`` is False when the call left the rank unfit for another call (it destroyed the
    default process group), so the controller rebuilds the world first. ``group_count`` is
    the rank's process-group counter after the call: ranks whose counters differ (a
    ``new_group`` called on some ranks only) could not meet in their next group.
    ``leaks`` is what the call left running or open in the rank, one line each
    (``"thread 'worker' started at test_x.py:12 is still alive"``; see
    :mod:`harness.rank.leaks`); empty when nothing, or when the call did not ask.
    """

    value: bytes
    reusable: bool = True
    group_count: int = 0
    leaks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Failed:
    """The call or the rank's start-up raised.

    ``at`` is ``time.monotonic()`` when the exception was caught; the monotonic clock is
    shared by all processes of a machine, so the controller can tell which rank failed first.
    """

    failure: RankFailure
    at: float


@dataclass(frozen=True)
class Skipped:
    """The call raised a skip exception; ``kind`` is ``"pytest"`` or ``"unittest"``."""

    reason: str
    kind: str
    at: float


RankMessage = Ready | Done | Failed | Skipped
"""Everything a rank sends."""


# -- the payload of a pytest test call -------------------------------------------------------


@dataclass(frozen=True)
class RankValue:
    """Placeholder for a rank-side fixture (``rank``, ``world_size``, ``local_rank``,
    ``local_device``: values only a rank knows), replaced by its value inside each rank."""

    name: str

    def __repr__(self) -> str:
        return f"<{self.name}: filled in inside each rank>"


@dataclass(frozen=True)
class TestRef:
    """How to find a test function inside a rank (never the function object itself).

    Attributes:
        module: The module's name in the controller's ``sys.modules``.
        path: The module's file.
        cls: Qualified name of the test class, or None for a plain function.
        function: The function's name in its module or class.
        sys_path: The controller's ``sys.path`` when the test ran.
        rewrite: Whether pytest rewrote the module's asserts in the controller.
        instance_state: The controller's test-class instance ``__dict__`` (what xunit-style
            ``setup_method`` put there), copied onto the rank's instance.
    """

    __test__ = False  # not a test class, whatever pytest's collection patterns say

    module: str
    path: str
    cls: str | None
    function: str
    sys_path: tuple[str, ...]
    rewrite: bool
    instance_state: dict[str, Any] | None = None
