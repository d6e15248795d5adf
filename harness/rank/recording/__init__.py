"""The recording of the collectives a rank's calls issue, from every source torch offers.

* :mod:`~harness.rank.recording.recorder`  the recorder: which collectives a call issues,
  per process group, and when; ``torch.distributed``'s functions wrapped to tell it
* :mod:`~harness.rank.recording.records`   a group's record of one call: tables of ops, sites
* :mod:`~harness.rank.recording.hooks`     collectives below torch.distributed, from torch's
  process-group hooks (torch >= 2.14)
* :mod:`~harness.rank.recording.hook_ops`  how a collective the hooks saw reads: its op, what
  issued it
* :mod:`~harness.rank.recording.functional` functional collectives, wrapped where torch has
  no hooks
* :mod:`~harness.rank.recording.flight_recorder` what torch's flight recorder saw that the
  recording did not
* :mod:`~harness.rank.recording.describe`  how a recorded call reads (its op)
* :mod:`~harness.rank.recording.issued`    the ``collectives`` fixture's value, read from the
  recording

The interface, for the rest of the rank side: :func:`install` once per rank, a
:class:`Recorder` per call (:func:`current`: the call's), :func:`snapshot` of the last one.
What is recorded reaches the controller as plain data (:mod:`harness.protocol.traces`).
Imports: see :mod:`harness.rank`.
"""

from harness.rank.recording import functional, hooks, recorder
from harness.rank.recording.recorder import Recorder, current, snapshot

__all__ = ["Recorder", "current", "install", "snapshot"]


def install() -> None:
    """Record every collective the rank's calls issue, however they issue it: wrap
    ``torch.distributed``'s functions, then put torch's process-group hooks on every group
    where torch has them, else wrap the functional collectives.

    Once per rank, after ``leaks.note_group_sites`` (the hooks ride on its registry of
    groups) and before any user module is imported (one that did ``from
    torch.distributed import all_reduce`` then holds the wrapper).
    """
    recorder.install()
    hooks.install()
    functional.install()  # where the hooks cannot see functional collectives
