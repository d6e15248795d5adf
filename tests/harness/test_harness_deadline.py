"""Outside pytest too, a run has a deadline by default, and its timeout says how to change it."""

from __future__ import annotations

import inspect

import hangs_rankfns as fns
import pytest

import harness
from harness import validate
from harness.controller import fresh
from harness.controller import world as world_module
from harness.plugin import settings


def test_the_default_deadline_is_the_plugins() -> None:
    assert validate.DEFAULT_TIMEOUT_S == 120.0
    assert settings.DEFAULT_TIMEOUT_S == validate.DEFAULT_TIMEOUT_S
    for fn in (fresh.run, world_module.World.__init__):
        default = inspect.signature(fn).parameters["timeout"].default
        assert default == validate.DEFAULT_TIMEOUT_S, fn


def test_a_world_without_a_timeout_gets_the_default() -> None:
    with harness.World(1, backend="gloo") as world:
        assert world.timeout == validate.DEFAULT_TIMEOUT_S
    with harness.World(1, backend="gloo", timeout=None) as world:
        assert world.timeout is None


def test_a_rank_skipping_a_collective_times_out_saying_how_to_change_the_bound() -> None:
    # Rank 1 sleeps in Python code instead of joining the barrier: not provably stuck, so
    # the deadline ends the run (a short one here, as the default would be in its place).
    with pytest.raises(harness.WorldTimeout) as info:
        harness.run(fns.rank1_skips_the_barrier, world_size=2, backend="gloo", timeout=2)
    error = info.value
    assert error.timeout == 2.0
    assert error.summary.startswith("the run did not finish within 2 s: ranks 0, 1 still running")
    assert error.verdicts == [
        "rank 1 never reached collective #1 (barrier) that rank 0 waits in; "
        f"rank 1 is in time.sleep at {fns.line_of('skips')}"
    ]
    hint = (
        "The bound is the run's timeout (2 s): pass timeout=<seconds> to World.run, "
        "World(...) or harness.run to change it; timeout=None on World(...) or harness.run "
        "waits without bound."
    )
    assert error.hint == hint
    assert str(error).endswith("\n\n" + hint)


def test_world_run_says_it_too(world2: harness.World) -> None:
    with pytest.raises(harness.WorldTimeout) as info:
        world2.run(fns.rank1_skips_the_barrier, timeout=1.5)
    assert "The bound is the run's timeout (1.5 s): pass timeout=<seconds>" in str(info.value)
