"""A World's call at its two ends: its options checked on the way in; on the way out, each
rank's captured output, the ``stacklevel`` of its warnings, and its return value (a timeout
saying how to change the bound)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from harness import compat, validate
from harness.controller.outcome import Outcome
from harness.controller.spawn import RankProcess
from harness.errors import WorldTimeout
from harness.faults.checks import checked
from harness.protocol.messages import OUTPUTS, CallOptions, Done

_CONTROLLER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def checked_timeout(value: float | None) -> float | None:
    """A call's or a World's ``timeout``, checked: seconds, or None for no bound."""
    return None if value is None else validate.seconds(value, "timeout", optional=True)


def checked_options(
    options: CallOptions | None, timeout: float | None, world_size: int
) -> CallOptions:
    """``options`` checked for a World of ``world_size`` ranks whose timeout is ``timeout``
    (it stands where the call gives none); the faults are placed on the World's ranks."""
    if options is None:
        return CallOptions(timeout)
    if not isinstance(options, CallOptions):
        raise TypeError(f"options must be a harness.CallOptions, not {options!r}")
    if options.output not in OUTPUTS:
        raise ValueError(
            f"output must be one of {', '.join(map(repr, OUTPUTS))}, not {options.output!r}"
        )
    validate.flag(options.check_collectives, "check_collectives")
    bound = timeout if options.timeout is None else checked_timeout(options.timeout)
    faults = checked(options.faults, world_size)
    if bound == options.timeout and faults == options.faults:
        return options
    return replace(options, timeout=bound, faults=faults)


def captured(proc: RankProcess, reply: object) -> tuple[str, str]:
    """What a rank wrote during a captured call: read from its files unless it said it wrote
    nothing (a rank that failed or died says nothing, so its files are read)."""
    if isinstance(reply, Done) and not reply.output_written:
        return "", ""
    return proc.files.output()


def callers_level() -> int:
    """The ``stacklevel``, from the function that calls this, of the first caller outside the
    controller: a warning points at the code that made the call."""
    level = 2  # warn's stacklevel 2: the caller of that function, frame(2) from here
    frame = compat.frame(2)
    while frame is not None and frame.f_code.co_filename.startswith(_CONTROLLER_DIR):
        frame = frame.f_back
        level += 1
    return level


def result(outcome: Outcome) -> list[Any]:
    """``outcome.result()``, a timeout saying how to change the bound."""
    error = outcome.error
    if isinstance(error, WorldTimeout) and error.timeout is not None and not error.hint:
        error.hint = (
            f"The bound is the run's timeout ({error.timeout:g} s): pass timeout=<seconds> "
            "to World.run, World(...) or harness.run to change it; timeout=None on "
            "World(...) or harness.run waits without bound."
        )
    return outcome.result()
