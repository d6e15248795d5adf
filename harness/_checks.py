"""Argument checks shared by ``World`` and the pytest plugin (no torch import here)."""

from __future__ import annotations

import math


def check_world_size(world_size: object) -> int:
    """Validate a world size; return it.

    Raises:
        TypeError: If it is not an int.
        ValueError: If it is smaller than 1.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool):
        raise TypeError(f"world_size must be an int >= 1, not {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return world_size


def check_timeout(timeout: object) -> float | None:
    """Validate a timeout in seconds (None means no bound); return it as a float."""
    if timeout is None:
        return None
    if (
        not isinstance(timeout, (int, float))
        or isinstance(timeout, bool)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    return float(timeout)
