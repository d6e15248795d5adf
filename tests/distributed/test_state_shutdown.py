"""fhelium.distributed.shutdown against real Gloo process groups, each case in a fresh process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _fresh
import _shutdown_children as children
import pytest
from _fresh import Outcome

WORLD_OF_ONE = {
    "initialized": True,
    "backend": "gloo",
    "world_size": 1,
    "rank": 0,
    "store": "HashStore",
    "group_count": 1,
}


def test_shutdown_before_init_is_a_no_op() -> None:
    result = _fresh.run(children.before_init)
    for call in ("first", "second"):
        outcome: Outcome = result[call]
        assert not outcome.raised, outcome
        assert outcome.value is None
    assert result["initialized"] is False
    assert result["state_after_init"] == WORLD_OF_ONE
    assert result["after"] is False


@pytest.mark.parametrize("explicit_world", [False, True], ids=["None", "group.WORLD"])
def test_shutdown_of_a_world_of_one(explicit_world: bool) -> None:
    result = _fresh.run(children.world_of_one, explicit_world)
    assert result["before"] == 1.0
    assert result["returned"] is None  # no Work handle, nothing at all
    assert result["initialized"] is False
    assert result["groups"] == 0
    assert result["world"] is None
    assert result["collective_after"].raised, "a destroyed group must not run collectives"
    assert result["again"] == Outcome(value=None, elapsed=result["again"].elapsed)
    assert result["reinit"] == WORLD_OF_ONE
    assert result["reinit_sum"] == 1.0


@pytest.mark.parametrize("value", [5, 0, "gloo", 1.0], ids=["rank-5", "rank-0", "str", "float"])
def test_shutdown_of_something_that_is_not_a_group_is_a_type_error(value: Any) -> None:
    result = _fresh.run(children.not_a_group, value)
    for when in ("before_init", "after_init"):
        outcome: Outcome = result[when]
        assert outcome.exc_type == "TypeError", (when, outcome)
    # The failed call destroyed nothing.
    assert result["still"] == WORLD_OF_ONE
    assert result["sum"] == 1.0


def test_shutdown_of_a_subgroup_keeps_the_default_group(tmp_path: Path) -> None:
    """Decision 8, in a world of two processes."""
    results = _fresh.run_world(children.subgroup, 2, str(tmp_path / "filestore"))
    for rank, result in enumerate(results):
        groups_before = result["groups_before"]
        assert groups_before >= 3  # the default group and the two subgroups of all ranks
        assert result["first_before"] == 2.0
        assert result["returned"] is None
        assert result["initialized"] is True
        assert result["groups_after"] == groups_before - 1
        assert result["first_registered"] is False  # PyTorch no longer knows the group
        assert result["second_after"] == 2.0
        assert result["default_after"] == 2.0
        assert result["state_after"]["world_size"] == 2
        assert result["state_after"]["rank"] == rank
        if rank == 0:
            assert result["only_zero_after"] == 1.0
        assert result["default_returned"] is None
        assert result["initialized_end"] is False
        assert result["groups_end"] == 0
        stale: Outcome = result["stale_subgroup"]
        assert not stale.raised, stale
        assert stale.value is None


def test_without_torch_distributed() -> None:
    """A build without torch.distributed (simulated: is_available() is False in the child)."""
    result = _fresh.run(children.unavailable)
    assert result["shutdown"].value is None
    assert not result["shutdown"].raised
    assert result["init"].exc_type == "RuntimeError"


def test_shutdown_right_after_collectives_on_temporary_tensors() -> None:
    """shutdown() must not hang when the tensors of the last collectives are already freed.

    With torch < 2.8, the Gloo process group's destructor joins its worker threads while
    holding the GIL, and a worker that frees the last reference to a finished collective's
    tensor needs the GIL (pytorch/pytorch#154976 releases it). A hang is killed by the
    helper's timeout and fails the test.
    """
    result = _fresh.run(children.cycles_with_temporaries, 100, timeout=30)
    assert result == {"cycles": 100, "initialized": False}
