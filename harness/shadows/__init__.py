"""Shadow worlds: a distributed test's body on every rank of a larger, simulated world.

A test that asks for them (``@pytest.mark.distributed(shadow=[64, 1024])``, or
``--dist-shadow=1024`` for every distributed test) runs, once its real run passed, on every
rank of each shadow size: each simulated rank in a process of its own, forked from a warm
one, with no real communication. What every rank's groups issued is then compared, as the
desync check compares a real run's.

Two sides, as in the rest of the harness:

* the controller's (the pytest process):

  * :mod:`~harness.shadows.worlds`  a test's shadow worlds run, one call of the host each
  * :mod:`~harness.shadows.check`   what a run shows: its verdicts, faithful or not, compact
  * :mod:`~harness.shadows.search`  the smallest size that shows a difference: what to try

* the ranks' (the host, a rank of a world without a process group, and the processes it
  forks):

  * :mod:`~harness.shadows.entry`     the function the controller names, importing nothing
  * :mod:`~harness.shadows.host`      the ranks forked, several at a time, and gathered
  * :mod:`~harness.shadows.simulate`  one simulated rank: its world, its groups, the body
  * :mod:`~harness.shadows.backend`   the shadow's process groups: data, ``Work``, records

* and what both agree on, :mod:`~harness.shadows.records` (the standard library and the
  protocol alone).

The ranks' side imports what the rank side may (see :mod:`harness.rank`), never the
controller's side; import-linter contracts in ``pyproject.toml`` hold both.
"""
