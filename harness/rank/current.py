"""This process's rank context: the rank side's one module-level state.

A rank's state lives on its :class:`~harness.rank.context.RankContext`, which
:func:`harness.rank.loop.main` makes once and installs here (:func:`install`). What is
handed the context gets it as an argument; what is not reads it here: the wrappers and hooks
installed into torch, a logging handler, the ``caplog`` and ``collectives`` fixtures, and the
functions the controller names as a call (a test body, the end of a fixture scope). Like
trio's run context, it is set once per process and read everywhere else: the forkserver,
which preloads the rank side before any rank exists, and the controller, which imports some
of it, have none.

This module imports nothing at run time, so that any module of the rank side may import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.rank.context import RankContext

_context: RankContext | None = None


def install(ctx: RankContext) -> None:
    """Make ``ctx`` this process's rank context, once.

    Raises:
        RuntimeError: The process has a rank context already (a process is one rank).
    """
    global _context
    if _context is not None:
        raise RuntimeError(
            f"this process is rank {_context.rank} already: a process installs one rank "
            f"context, not a second one (for rank {ctx.rank})"
        )
    _context = ctx


def replace(ctx: RankContext) -> None:
    """Make ``ctx`` the rank context of a process forked from a rank to be another rank (a
    shadow world's simulated rank, :mod:`harness.shadows.simulate`): it replaces the one
    the process inherited."""
    global _context
    _context = ctx


def context() -> RankContext:
    """This process's rank context.

    Raises:
        RuntimeError: The process is no rank (the controller, the forkserver, a plain
            Python process): only :func:`harness.rank.loop.main` makes a rank.
    """
    if _context is None:
        raise RuntimeError(
            "this runs inside a rank process only (one that harness.rank.loop.main runs), "
            "and this process is none: it has no rank context"
        )
    return _context


def context_or_none() -> RankContext | None:
    """This process's rank context; None where the process is no rank."""
    return _context
