"""Where the rank side is entered.

These are the functions the controller names, importing nothing.

A new rank process starts in :func:`rank_main`; a pytest test body runs through
:func:`run_test`, and rank-side fixtures of a wider scope end through :func:`end_scopes`.
The controller hands these functions to new processes and to calls, pickled by name. The
modules that do the work are imported only when a function runs, inside a rank (where the
forkserver has preloaded them), so the controller, which only names them, does not import
the rank loop, the fixture machinery or the collective recording for its first test. This
module itself imports only the standard library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from harness.protocol.messages import RankSetup
    from harness.protocol.pytest_calls import FixturePlan, TestRef


def rank_main(setup: RankSetup, conn: Connection, lifeline: Connection) -> NoReturn:
    """A rank process's target.

    It names the process for ``ps`` (``harness rank 1/4 (gloo)``), then runs
    :func:`harness.rank.loop.main`.
    """
    from harness.rank import loop, title

    title.set_title(f"harness rank {setup.rank}/{setup.world_size} ({setup.backend})")
    loop.main(setup, conn, lifeline)


def run_test(ref: TestRef, plan: FixturePlan) -> tuple[float, float, float]:
    """Run a pytest test on this rank: :func:`harness.rank.pytest_body.run_pytest_test`."""
    from harness.rank import pytest_body

    return pytest_body.run_pytest_test(ref, plan)


def end_scopes(scope_keys: list[str] | None) -> None:
    """End rank-side fixture scopes: :meth:`harness.rank.fixtures.Scopes.end` of this rank's."""
    from harness.rank import current

    current.context().fixtures.end(scope_keys)
