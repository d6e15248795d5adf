"""The messages a controller and its ranks exchange, one class each.

Each rank has one duplex pipe to its controller. Everything that crosses it is one of the
classes below, so the protocol can be read here in one place:

controller -> rank
    ``Call``  run one function and answer with ``Done``, ``Failed`` or ``Skipped``.

rank -> controller
    ``Ready``    the default process group is up (answers the start of a rank).
                 It also names the rank's main and watchdog threads for stack dumps.
    ``Done``     the call returned; ``value`` is its pickled return value.
    ``Failed``   the call (or start-up) raised; the rank exits right after sending this, so
                 peers blocked in a collective with it fail at once instead of waiting for
                 the process-group timeout.
    ``Skipped``  the call raised a skip exception (pytest's or unittest's).

User objects travel pre-pickled as ``bytes``: the messages themselves always pickle, and a
failure to (un)pickle user data is reported by the side that saw it, naming the object.
Stopping needs no message: a second pipe, the rank's lifeline, carries nothing at all. When the
controller closes it (or dies) the rank's watchdog thread saves coverage and ends the rank,
also while its main thread is stuck in a collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness._errors import RankFailure


@dataclass(frozen=True)
class RankSetup:
    """What a rank is told when it starts (the process argument, not a pipe message).

    Attributes:
        rank: Global rank.
        world_size: Number of ranks.
        backend: Resolved backend (``"gloo"``, ``"nccl"``, ...), never ``"auto"``.
        inherited: The controller's ``os.environ`` when the rank started. A forked rank would
            otherwise see the forkserver's environment, frozen when that server started.
        env: The rank's torchrun variables, set over ``inherited``.
        workdir: The world generation's private directory: rendezvous store, capture and
            stack files, coverage data.
        coverage: Keyword arguments for the rank's ``coverage.Coverage``, or None.
    """

    rank: int
    world_size: int
    backend: str
    inherited: dict[str, str]
    env: dict[str, str]
    workdir: str
    coverage: dict[str, Any] | None


def rank_file(workdir: str, rank: int, kind: str) -> str:
    """Path of one of a rank's files: ``out``, ``err``, ``stacks`` or ``crash``."""
    return f"{workdir}/rank{rank}.{kind}"


@dataclass(frozen=True)
class Call:
    """Run ``fn(*args, **kwargs)`` from the pickled ``payload`` (a ``(fn, args, kwargs)`` tuple).

    ``capture`` redirects the rank's stdout/stderr file descriptors to its capture files for
    the duration of the call (the controller reads them afterwards, even after a crash).
    ``env`` is the controller's ``os.environ`` when it differs from the one the rank started
    with (a fixture's ``monkeypatch.setenv``, say): the call sees it, with the rank's torchrun
    variables on top, and the rank's own environment is restored afterwards.
    """

    payload: bytes
    capture: bool = False
    env: dict[str, str] | None = None


@dataclass(frozen=True)
class Ready:
    """The rank's default process group is initialized."""

    pid: int
    main_thread: int
    watchdog_thread: int


@dataclass(frozen=True)
class Done:
    """The call returned normally.

    ``reusable`` is False when the call left the rank unfit for another call (it destroyed the
    default process group), so the controller rebuilds the world first.
    """

    value: bytes
    reusable: bool = True


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
