"""The fault makers, one per kind: ``kill``, ``exit``, ``error``, ``delay``, ``hang`` and
``corrupt``, each public in :mod:`harness.faults`.

Each places its fault at ``at``: collective ``#at`` of the fault's group, or a
:class:`~harness.faults.Collective` (``Collective("all_reduce", 2, site="train.py:34")``: the
2nd ``all_reduce`` issued at that line), which stays the same collective where torch releases
number them differently.

A maker records its arguments without checking them: a bad fault made at a test module's
import fails the run or test that uses it (:mod:`harness.faults.checks`), not the import.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable
from typing import Any

from harness.faults.places import Collective
from harness.faults.values import KINDS, Fault


def kill(
    rank: int,
    at: int | Collective,
    *,
    group: tuple[int, ...] | None = None,
    when: str = "before",
    signal: int = _signal.SIGKILL,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Kill ``rank`` with ``signal`` before, during or after its collective ``at``."""
    return Fault("kill", rank, at, group, when=when, signal=signal, strict=strict, attempt=attempt)


def exit(
    rank: int,
    at: int | Collective,
    code: int,
    *,
    group: tuple[int, ...] | None = None,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Make ``rank`` exit with status ``code`` (``os._exit``) instead of entering collective
    ``at``."""
    return Fault("exit", rank, at, group, code=code, strict=strict, attempt=attempt)


def error(
    rank: int,
    at: int | Collective,
    exc: BaseException | type[BaseException],
    *,
    group: tuple[int, ...] | None = None,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Make collective ``at`` raise ``exc`` on ``rank`` instead of running."""
    return Fault("error", rank, at, group, exc=exc, strict=strict, attempt=attempt)


def delay(
    rank: int,
    at: int | Collective,
    seconds: float,
    *,
    group: tuple[int, ...] | None = None,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Make ``rank`` sleep ``seconds`` before entering collective ``at`` (a straggler)."""
    return Fault("delay", rank, at, group, seconds=seconds, strict=strict, attempt=attempt)


def hang(
    rank: int,
    at: int | Collective,
    *,
    group: tuple[int, ...] | None = None,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Make ``rank`` block, alive, instead of entering collective ``at``."""
    return Fault("hang", rank, at, group, strict=strict, attempt=attempt)


def corrupt(
    rank: int,
    at: int | Collective,
    fn: Callable[[Any], object],
    *,
    group: tuple[int, ...] | None = None,
    strict: bool = True,
    attempt: int = 0,
) -> Fault:
    """Call ``fn(tensor)`` on ``rank``'s input tensor of collective ``at`` before it runs
    (``fn`` changes it in place; it must pickle: a module-level function)."""
    return Fault("corrupt", rank, at, group, fn=fn, strict=strict, attempt=attempt)


MAKERS: dict[str, Callable[..., Fault]] = {kind: globals()[kind] for kind in KINDS}
"""Each kind's maker, by the kind's name (:data:`~harness.faults.values.KINDS`)."""


def for_kind(kind: str | Callable[..., Fault]) -> Callable[..., Fault]:
    """The maker of ``kind``: given by its name (``"kill"``) or as itself (``faults.kill``).

    Raises:
        ValueError: ``kind`` is neither, naming the valid kinds.
    """
    maker = MAKERS.get(kind) if isinstance(kind, str) else kind
    if maker is None or maker not in MAKERS.values():
        raise ValueError(f"unknown fault kind {kind!r}; valid: {', '.join(KINDS)}")
    return maker
