"""Where the ranks' time limits come from, on configs and items made in this process (no
ranks run): pytest-timeout's limit from each place it can be set (``--timeout``, the marker,
``PYTEST_TIMEOUT``, ini ``timeout``), and the harness's own from pytest's real
``--dist-timeout`` option and ``dist_timeout`` ini value.

pytest-timeout resolves the place in its own settings lookup, which
``compat.pytest_timeout_settings`` reads; the end-to-end runs of
``tests/plugin/test_plugin_interrupts.py`` take one place per path of the harness's own (its
timer armed, or ``func_only``) and check the deadline and the report there.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from _pytest import unraisableexception

from harness.compat import pytest_internals as compat
from harness.plugin import item_state, settings
from harness.plugin.interrupts import taken_over

LIMIT_S = 4
HARNESS_TIMEOUT_S = 3600.0

TEST = """
import pytest

{marks}
def test_limited():
    pass
"""


def _without_collecting_garbage(config: pytest.Config) -> pytest.Config:
    """``config``, whose unconfigure skips pytest's full garbage collections.

    They look for unraisable exceptions of the inner session, and take seconds in a process
    that has torch imported; pytester's own in-process runs skip them the same way. A pytest
    without the key (before 8.4) makes no such collections.
    """
    key = getattr(unraisableexception, "gc_collect_iterations_key", None)
    if key is not None:
        config.stash[key] = 0
    return config


def _item(pytester: pytest.Pytester, *args: str, marker: bool = False) -> pytest.Item:
    """The collected ``test_limited``, under a config made from ``args`` (no session runs)."""
    marks = f"@pytest.mark.timeout({LIMIT_S})" if marker else ""
    module = pytester.getmodulecol(TEST.format(marks=marks), configargs=args)
    _without_collecting_garbage(module.config)
    item = pytester.collect_by_name(module, "test_limited")
    assert isinstance(item, pytest.Item)
    return item


@pytest.mark.parametrize("how", ["option", "marker", "env", "ini", "func_only"])
def test_each_place_pytest_timeout_is_set_is_the_deadline(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    args: tuple[str, ...] = ()
    if how == "option":
        args = ("--timeout", str(LIMIT_S))
    elif how == "env":
        monkeypatch.setenv("PYTEST_TIMEOUT", str(LIMIT_S))
    elif how == "ini":
        pytester.makeini(f"[pytest]\ntimeout = {LIMIT_S}\n")
    elif how == "func_only":
        pytester.makeini(f"[pytest]\ntimeout = {LIMIT_S}\ntimeout_func_only = true\n")
    item = _item(pytester, *args, marker=how == "marker")
    found = compat.pytest_timeout_settings(item)
    assert found is not None
    assert found.timeout == LIMIT_S, found
    assert found.func_only == (how == "func_only"), found
    with taken_over(item, HARNESS_TIMEOUT_S) as deadline:
        assert deadline.limit == LIMIT_S, deadline
        assert 0 < deadline.seconds <= LIMIT_S, deadline


class _Armed:
    """Records each limit pytest-timeout's timer is armed with, in its place."""

    def __init__(self) -> None:
        self.limits: list[float] = []

    @pytest.hookimpl(tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool:
        self.limits.append(settings.timeout)
        return True


def test_once_the_ranks_used_the_limit_up_the_rest_is_bounded_by_the_larger_one(
    pytester: pytest.Pytester,
) -> None:
    # The rest of the test (its report, its teardown) must not get a short limit again: a
    # loaded machine's garbage collection alone can outlast it.
    item = _item(pytester, "--timeout", str(LIMIT_S))
    found = compat.pytest_timeout_settings(item)
    armed = _Armed()
    item.config.pluginmanager.register(armed)
    # pytest-timeout armed its timer longer ago than its limit: the ranks used it all up.
    item_state.of(item).armed = (found, time.monotonic() - 2 * LIMIT_S)
    with taken_over(item, HARNESS_TIMEOUT_S) as deadline:
        assert deadline.limit == LIMIT_S, deadline
    assert armed.limits == [HARNESS_TIMEOUT_S]


def test_without_a_limit_the_harnesss_own_timeout_is_the_deadline(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_TIMEOUT", raising=False)
    item = _item(pytester)
    found = compat.pytest_timeout_settings(item)
    assert found is not None
    assert not found.timeout, found
    with taken_over(item, HARNESS_TIMEOUT_S) as deadline:
        assert (deadline.seconds, deadline.limit) == (HARNESS_TIMEOUT_S, None), deadline


@pytest.mark.parametrize("how", ["option", "ini"])
def test_the_harnesss_timeout_is_read_from_pytests_option_and_ini(
    pytester: pytest.Pytester, how: str
) -> None:
    # The end-to-end timeout report (tests/plugin/test_plugin_reports.py) sets it by marker.
    args: tuple[str, ...] = ()
    if how == "option":
        args = ("--dist-timeout", "1")
    else:
        pytester.makeini("[pytest]\ndist_timeout = 1\n")
    config = _without_collecting_garbage(pytester.parseconfigure(*args))
    assert settings.read(config).timeout == 1.0
