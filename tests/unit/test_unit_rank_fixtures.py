"""What the plan of a marked test carries to its ranks, on items collected in this process (no
ranks run): the ranks' view of ``request`` (the session's config, pickled) only for a test or
fixture of its own that asks for ``request``, never for the built-ins that merely declare it.
"""

from __future__ import annotations

import pytest

from harness.plugin import rank_fixtures

TESTS = """
import harness
import pytest


@harness.fixture
def asks(request):
    return request.node.name


@pytest.mark.distributed(world_size=2)
def test_rank_only(rank, world_size, capsys):
    pass


@pytest.mark.distributed(world_size=2)
def test_own_request(rank, request):
    pass


@pytest.mark.distributed(world_size=2)
def test_fixture_request(rank, asks):
    pass
"""


def test_the_request_view_goes_only_where_a_test_or_its_fixture_asks(
    pytester: pytest.Pytester,
) -> None:
    # --collect-only: the plugin starts no rank server for the marked tests it collects.
    module = pytester.getmodulecol(TESTS, configargs=("--collect-only",))
    sent = {}
    for name in ("test_rank_only", "test_own_request", "test_fixture_request"):
        item = pytester.collect_by_name(module, name)
        assert isinstance(item, pytest.Function)
        rank_fixtures.split(item)
        plan = rank_fixtures.plan(item)
        sent[name] = plan.request is not None
        builtins = {fixture.name: fixture.args for fixture in plan.fixtures if fixture.builtin}
        assert "rank" in builtins, name
        assert set(builtins.values()) == {()}, name  # a built-in's value reads no argument
    assert sent == {"test_rank_only": False, "test_own_request": True, "test_fixture_request": True}
