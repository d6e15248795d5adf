"""Process groups of other backends and torch's process-group hooks (torch >= 2.14): a
backend of the user's (``Backend.register_backend``) takes the hooks as Gloo does, so its
functional collectives are recorded; a group that takes none is recorded through
``torch.distributed``'s functions only, and a warning says so once. Real ranks, real Gloo
(the custom backend relays to it)."""

from __future__ import annotations

import hook_backends_rankfns as fns
import pytest

import harness
from harness import compat

pytestmark = pytest.mark.skipif(
    not compat.collective_hooks_available(), reason="torch < 2.14 has no process-group hooks"
)


def test_a_custom_backends_collectives_are_recorded_through_the_hooks() -> None:
    with harness.World(2, backend="gloo") as world:
        results = world.run(fns.on_a_custom_backend)
    for functional, plain, seen, messages in results:
        assert functional == plain == [2.0, 2.0]
        # The functional one through the hooks (no reduce op), the plain one through the
        # wrapper: one record each.
        assert seen == [
            ("all_reduce", "functional all_reduce", None),
            ("all_reduce", None, "SUM"),
        ]
        assert messages == []


def test_a_group_without_hooks_is_named_once() -> None:
    with harness.World(1, backend="gloo") as world:
        first, again = (
            world.run(fns.groups_without_hooks)[0],
            world.run(fns.groups_without_hooks)[0],
        )
    assert first == [
        "harness: a process group of backend '_NoHooks' takes no collective hooks: its "
        "collectives are recorded only where issued through torch.distributed's functions "
        "(not DDP's, functional or compiled ones)"
    ]
    assert again == []
