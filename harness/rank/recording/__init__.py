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

What is recorded reaches the controller as plain data (:mod:`harness.protocol.traces`).
Imports: see :mod:`harness.rank`.
"""

from harness.rank.recording.recorder import Recorder, current, install, snapshot

__all__ = ["Recorder", "current", "install", "snapshot"]
