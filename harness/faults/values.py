"""What a fault is: the :class:`Fault` record, the rules its arguments follow, and
:class:`FaultFired`.

Both are public as ``harness.faults.Fault`` and ``harness.faults.FaultFired``. This module
imports neither torch nor pytest.
"""

from __future__ import annotations

import math
import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.faults.places import Collective

WHEN = ("before", "during", "after")
"""When a ``kill`` strikes: instead of entering the collective, inside it (the rank has
started it and its peers may be waiting on its data), or once it returned."""


@dataclass(frozen=True)
class Fault:
    """One fault: a kind, the rank it acts on, and the collective it acts at: by its number,
    or by what it is (a :class:`~harness.faults.Collective`).

    Made by :func:`~harness.faults.kill`, :func:`~harness.faults.exit`,
    :func:`~harness.faults.error`, :func:`~harness.faults.delay`, :func:`~harness.faults.hang`
    or :func:`~harness.faults.corrupt`; the fields that do not apply to a kind keep their defaults.

    Attributes:
        kind: One of :data:`KINDS`.
        rank: The global rank it acts on.
        at: The collective it acts at: its number, from 1, per process group; or a
            :class:`~harness.faults.Collective` (its op, call site and occurrence).
        group: The global ranks of the process group whose collectives are counted, sorted;
            None for the default group.
        when: ``kill`` only: one of :data:`WHEN`.
        signal: ``kill`` only: the signal number.
        code: ``exit`` only: the exit status.
        exc: ``error`` only: what the collective raises (an exception or exception class).
        seconds: ``delay`` only: how long the rank sleeps before entering.
        fn: ``corrupt`` only: called with the rank's input tensor, changes it in place.
        strict: Whether a fault that never fires is an error.
        attempt: The attempt of a run with restarts it acts in (0: the first), so that the
            attempts after it run clean.
    """

    kind: str
    rank: int
    at: int | Collective
    group: tuple[int, ...] | None = None
    when: str = "before"
    signal: int = int(_signal.SIGKILL)
    code: int = 0
    exc: BaseException | type[BaseException] | None = None
    seconds: float = 0.0
    fn: Callable[[Any], object] | None = None
    strict: bool = True
    attempt: int = 0

    def __post_init__(self) -> None:
        # Normalised where the value allows; every field is checked when a run uses the fault
        # (:meth:`check`), so that a bad one fails that run, not the import of its module.
        if isinstance(self.group, tuple) and all(_is_int(member) for member in self.group):
            object.__setattr__(self, "group", tuple(sorted(self.group)))
        if _is_signal(self.signal):
            # A plain int: Signals members travel as the number they stand for.
            object.__setattr__(self, "signal", int(self.signal))

    def problem(self) -> str:
        """What is wrong with the fault's own arguments ('' when nothing), naming the bad
        value and what would be valid."""
        for rule in _RULES:
            found = rule(self)
            if found:
                return found
        return ""

    @property
    def id(self) -> str:
        """The test id of this fault in a sweep, such as ``kill-r1-at3``."""
        kind = f"kill-{self.when}" if self.kind == "kill" and self.when != "before" else self.kind
        # Any value reads (a bad one is reported when the case runs, by this id).
        members = self.group if isinstance(self.group, tuple) else (self.group,)
        group = "" if self.group is None else "-g" + "_".join(map(str, members))
        attempt = f"-attempt{self.attempt}" if self.attempt else ""
        at = self.at.id if isinstance(self.at, Collective) else f"at{self.at}"
        return f"{kind}-r{self.rank}-{at}{group}{attempt}"

    def __repr__(self) -> str:
        # What code that imported harness.faults as faults can paste: at=faults.Collective(...).
        return f"faults.{self._text(repr(self.at))}"

    def __str__(self) -> str:
        # A placed fault's Collective reads as itself; any other value as its repr: a
        # value of the wrong type reads as what it is (rank='1' is no rank).
        return self._text(str(self.at) if isinstance(self.at, Collective) else repr(self.at))

    def _text(self, at: str) -> str:
        details = [f"rank={self.rank!r}", f"at={at}"]
        details += _DETAILS.get(self.kind, _no_details)(self)
        if self.group is not None:
            details.append(f"group={self.group!r}")
        if self.attempt:
            details.append(f"attempt={self.attempt!r}")
        return f"{self.kind}({', '.join(details)})"

    @property
    def enters(self) -> bool:
        """Whether the rank enters the collective (not when it exits, hangs or is killed
        before it)."""
        return self.kind not in ("exit", "hang") and (self.kind, self.when) != ("kill", "before")

    @property
    def point(self) -> str:
        """How a report names the collective it acts at: ``collective #3``, or ``the 2nd
        all_reduce at train.py:34``."""
        return self.at.text if isinstance(self.at, Collective) else f"collective #{self.at}"

    @property
    def group_name(self) -> str:
        """How a report names the group: ``the default group`` or ``group (0, 1)``."""
        return "the default group" if self.group is None else f"group {self.group}"

    def check(self, world_size: int) -> None:
        """Check the fault's arguments, then the fault against the size of the world it is
        used in.

        Raises:
            ValueError: An argument is not valid (see :meth:`problem`), or its rank, or a
                rank of its group, is not in the world; the message names the fault.
        """
        problem = self.problem()
        if problem:
            raise ValueError(f"fault {self}: {problem}")
        for member in (self.rank, *(self.group or ())):
            if member >= world_size:
                raise ValueError(
                    f"fault {self}: rank {member} is not in a world of {world_size} "
                    f"(valid ranks: 0 to {world_size - 1})"
                )


@dataclass(frozen=True)
class FaultFired:
    """What a fault did to its rank: the value in that rank's slot of ``World.run``'s result.

    Attributes:
        fault: The fault.
        what: What happened, e.g. ``killed (SIGKILL) before collective #3 (all_reduce at
            train.py:34) on the default group``.
        time: When, as ``time.monotonic()`` on the controller's clock (same machine).
        number: The number of the collective it acted at, on the fault's group (0: unknown).
        op: That collective's op (``"all_reduce"``; '' where unknown).
        site: Its call site, ``"train.py:34"`` ('' where unknown).
        origin: What issued it below ``torch.distributed``'s functions (``"backward
            (DDP)"``; '' for a call of those functions).
    """

    fault: Fault
    what: str
    time: float
    number: int = 0
    op: str = ""
    site: str = ""
    origin: str = ""

    def __str__(self) -> str:
        return f"rank {self.fault.rank} {self.what}"

    def __repr__(self) -> str:
        return f"FaultFired({self})"


# ---------------------------------------------------------------- how a fault reads


def _kill_details(fault: Fault) -> list[str]:
    details = [] if fault.when == "before" else [f"when={fault.when!r}"]
    if fault.signal != _signal.SIGKILL:
        valid = _is_signal(fault.signal)
        name = _signal.Signals(fault.signal).name if valid else repr(fault.signal)
        details.append(f"signal={name}")
    return details


def _delay_details(fault: Fault) -> list[str]:
    seconds = fault.seconds
    return [f"seconds={seconds:g}" if _is_number(seconds) else f"seconds={seconds!r}"]


def _no_details(fault: Fault) -> list[str]:
    return []


_DETAILS: dict[str, Callable[[Fault], list[str]]] = {
    "kill": _kill_details,
    "exit": lambda fault: [f"code={fault.code}"],
    "error": lambda fault: [f"exc={fault.exc!r}"],
    "delay": _delay_details,
    "hang": _no_details,
    "corrupt": lambda fault: [f"fn={getattr(fault.fn, '__qualname__', fault.fn)!s}"],
}
"""What a fault of each kind shows after its rank and collective: its kind's own arguments,
where they differ from the default."""

KINDS = tuple(_DETAILS)
"""The kinds of fault, each made by the function of the same name
(:mod:`harness.faults.makers`): the one list of them."""


# ---------------------------------------------------------------- the rules of its arguments


def _kind(fault: Fault) -> str:
    if fault.kind in KINDS:
        return ""
    return f"unknown fault kind {fault.kind!r}; valid: {', '.join(KINDS)}"


def _place(fault: Fault) -> str:
    return (
        _index(fault.rank, "rank", minimum=0)
        or _at(fault.at)
        or _index(fault.attempt, "attempt", minimum=0)
    )


def _at(at: object) -> str:
    if isinstance(at, Collective):
        problem = at.problem()
        return f"at={at}: {problem}" if problem else ""
    if _is_int(at) and at >= 1:  # type: ignore[operator]
        return ""
    return (
        "at must be an int >= 1 (collectives are counted from 1) or a faults.Collective, "
        f"not {at!r}"
    )


def _group(fault: Fault) -> str:
    members = fault.group
    if members is None:
        return ""
    if not isinstance(members, tuple) or not members:
        return (
            f"group must be a non-empty tuple of global ranks (e.g. (0, 1)) or None "
            f"for the default group, not {members!r}"
        )
    for member in members:
        found = _index(member, "a rank of group", minimum=0)
        if found:
            return found
    if len(set(members)) != len(members):
        return f"group {members!r} names a rank twice"
    if fault.rank not in members:
        return f"rank {fault.rank} is not a member of group {members!r}"
    return ""


def _when(fault: Fault) -> str:
    if fault.when in WHEN:
        return ""
    return f"unknown when {fault.when!r}; valid: {', '.join(map(repr, WHEN))}"


def _signal_number(fault: Fault) -> str:
    if _is_signal(fault.signal):
        return ""
    return f"signal must be a signal number such as signal.SIGKILL, not {fault.signal!r}"


def _code(fault: Fault) -> str:
    if _is_int(fault.code) and 0 <= fault.code < 256:
        return ""
    return f"code must be an exit status from 0 to 255, not {fault.code!r}"


def _exc(fault: Fault) -> str:
    exc_type = fault.exc if isinstance(fault.exc, type) else type(fault.exc)
    if fault.kind != "error" or issubclass(exc_type, BaseException):
        return ""
    return (
        f"exc must be an exception or an exception class (e.g. RuntimeError('peer "
        f"lost')), not {fault.exc!r}"
    )


def _seconds(fault: Fault) -> str:
    seconds = fault.seconds
    if _is_number(seconds) and math.isfinite(seconds) and seconds >= 0:
        return ""
    return f"seconds must be a finite number >= 0, not {seconds!r}"


def _fn(fault: Fault) -> str:
    if fault.kind != "corrupt" or callable(fault.fn):
        return ""
    return f"fn must be callable (it gets the rank's tensor), not {fault.fn!r}"


def _strict(fault: Fault) -> str:
    strict: object = fault.strict  # typed bool, given anything
    return "" if isinstance(strict, bool) else f"strict must be True or False, not {strict!r}"


_RULES: tuple[Callable[[Fault], str], ...] = (
    _kind,
    _place,
    _group,
    _when,
    _signal_number,
    _code,
    _exc,
    _seconds,
    _fn,
    _strict,
)
"""The rules a fault's arguments follow, in the order they are checked: each says what is
wrong with its argument ('' when nothing). ``when``, ``signal``, ``code`` and ``seconds``
are checked whatever the kind (a maker leaves those a kind does not use at their valid
defaults); ``exc`` and ``fn`` for their own kind alone (their default, None, is no value)."""

_SIGNALS = frozenset(int(number) for number in _signal.Signals)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_signal(value: object) -> bool:
    # Signals() would take 9.0 or True as a signal.
    return _is_int(value) and value in _SIGNALS


def _index(value: object, what: str, *, minimum: int, why: str = "") -> str:
    """What is wrong with ``value`` as an int >= ``minimum`` ('' when nothing)."""
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        return f"{what} must be an int >= {minimum}{why}, not {value!r}"
    return ""
