"""A shadow world's process groups (``harness.shadows.backend``) on a rank: every collective
completes at once with the data it would have if every rank held this rank's data, which is
what torch's own fake group gives where it simulates uniform ranks (torch >= 2.15); its
``Work``'s future holds the tensors."""

from __future__ import annotations

import pytest
import shadow_rankfns as fns

import harness


def _fake_group_simulates_uniform_ranks() -> bool:
    try:
        from torch._C._distributed_c10d import FakeProcessGroup
    except ImportError:
        return False
    return hasattr(FakeProcessGroup.Options(), "simulate_uniform_ranks")


@pytest.mark.skipif(
    not _fake_group_simulates_uniform_ranks(),
    reason="torch's fake group simulates uniform ranks from torch 2.15 on",
)
def test_the_data_is_what_torchs_fake_group_gives_for_uniform_ranks() -> None:
    (found,) = harness.run(fns.shadow_and_fake, world_size=1, init=False)
    assert set(found) == set(fns.CALLS)
    for name, (shadow, fake) in found.items():
        assert shadow == fake, name


def test_a_collectives_future_holds_its_tensors() -> None:
    assert harness.run(fns.futures_hold_the_tensors, world_size=1, init=False) == [[4.0, 4.0]]
