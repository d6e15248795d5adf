"""Shared by the whole suite.

pytester's in-process runs snapshot ``sys.modules`` and drop every module first imported
during an inner run. The harness imports its controller modules lazily (so that the plugin
loads without torch), and its shadow worlds' (so that a session without them does not load
them); if an inner run were the first to import them, later tests would hold classes and
functions from modules no longer in ``sys.modules`` and could not pickle them to their ranks.
torch's functional collectives (which DTensor and torch's test utilities import) register an
operator library when imported, which a second import refuses: an inner run of a docs
example must not be the first to import them either. Importing them all here, before any
test runs, keeps one copy for the whole session.
"""

import pytest
import torch.testing._internal.common_distributed  # noqa: F401

import harness.controller.world
import harness.plugin.session
import harness.shadows.worlds  # noqa: F401

OPTIONAL_PLUGINS = {"timeout": "pytest-timeout"}
"""The optional pytest plugins a test may need (``@pytest.mark.needs_plugin(name)``), by the
name pytest registers each under, with the distribution that provides it."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs_plugin(name): the test relies on an optional pytest plugin (by its registered "
        "name, e.g. 'timeout'); it skips, naming it, where that plugin is not active",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Skipped, not failed, and never left to wait: a test that relies on pytest-timeout to
    # end a hang it plants would wait for a limit nobody enforces.
    for mark in item.iter_markers("needs_plugin"):
        name = mark.args[0]
        if not item.config.pluginmanager.hasplugin(name):
            package = OPTIONAL_PLUGINS.get(name, name)
            pytest.skip(f"needs the pytest plugin {name!r} (pip install {package}), not active")
