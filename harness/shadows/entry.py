"""Where a shadow world's host is entered: the function the controller names, importing
nothing (the host's modules load in the rank that runs it, as :mod:`harness.rank.entry`'s).

Imports: see :mod:`harness.shadows`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.shadows.records import ShadowJob, ShadowRun


def simulate(job: ShadowJob) -> ShadowRun:
    """Run ``job``'s shadow world on this rank: :func:`harness.shadows.host.simulate`."""
    from harness.shadows import host

    return host.simulate(job)
