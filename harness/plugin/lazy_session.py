"""The plugin's session, a :class:`~harness.plugin.session.DistSession`, made on first use.

It is kept in the pytest config's stash. Making it imports torch and the harness core, which
loading the plugin must not: the first distributed test, ``dist_world`` or ``--dist-mptc``
makes it, and the hooks that only tidy up look for it without making it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from harness.plugin.session import DistSession

_SESSION = pytest.StashKey["DistSession"]()


def get(config: pytest.Config) -> DistSession:
    """The session of ``config``, made (with the imports it needs) where there is none yet."""
    session = config.stash.get(_SESSION, None)
    if session is None:
        from harness.plugin.session import DistSession

        session = config.stash[_SESSION] = DistSession(config)
    return session


def peek(config: pytest.Config) -> DistSession | None:
    """The session of ``config`` if one was made (None: none was, and none is made now)."""
    return config.stash.get(_SESSION, None)
