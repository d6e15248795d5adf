"""The controller side: runs in the process that calls ``harness.run`` / ``harness.World``
(pytest's process, under the plugin). It never runs inside a rank.

* :mod:`~harness.controller.world`       ``World``: a world's life and its calls
* :mod:`~harness.controller.fresh`       ``harness.run``: one run on fresh ranks
* :mod:`~harness.controller.calls`       a call's two ends: options checked, output and result out
* :mod:`~harness.controller.restarts`    runs with restarts, as torchrun's agent restarts them
* :mod:`~harness.controller.exchange`    one round: a message to every rank, their replies
* :mod:`~harness.controller.waiting`     the wait's I/O: pipes and sentinels polled, stacks taken
* :mod:`~harness.controller.wait_rules`  the rules of that wait, one state per rank (pure logic)
* :mod:`~harness.controller.certain`     hangs the ranks' traces prove can never end, found early
* :mod:`~harness.controller.classify`    what the ranks' answers amount to (pure logic)
* :mod:`~harness.controller.leak_reports` what a call left in its reused ranks, told
* :mod:`~harness.controller.memory`      the ranks' memory as told; the limit that replaces them
* :mod:`~harness.controller.verdicts`    which collective went wrong (pure logic)
* :mod:`~harness.controller.outcome`     the outcome of a call, and what was seen of a rank
* :mod:`~harness.controller.spawn`       the process manager: where a rank is spawned and stopped
* :mod:`~harness.controller.forkserver`  the warm server ranks are forked from
* :mod:`~harness.controller.stacks`      faulthandler dumps made readable
* :mod:`~harness.controller.backends`    which backend, and whether it can run here
* :mod:`~harness.controller.gpus`        the run's GPUs, and exclusive leases on them
* :mod:`~harness.controller.lease_files` the lock files and waiters' tickets behind the leases
* :mod:`~harness.controller.pickling`    sending a call by pickle, naming what does not pickle
* :mod:`~harness.controller.coverage`    the ranks' coverage settings, and merging their data

It may import the protocol (:mod:`harness.protocol`), the shared modules (``errors``,
``validate``, ``compat``) and the rank side's entry points (a rank's process target), never
the pytest plugin (the core works without pytest) nor the timeline (:mod:`harness.timeline`,
drawn from what a call returned: no call needs it).
"""
