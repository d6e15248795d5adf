"""What the controller and its ranks agree on.

It is shared by both sides, and imports only the stdlib.

* :mod:`~harness.protocol.messages`    the named messages that cross a rank's pipe, and what a
  rank is told when it starts
* :mod:`~harness.protocol.pytest_calls`  what a pytest test's call carries: which test, its
  rank-side fixtures, a ``--dist-mptc`` case
* :mod:`~harness.protocol.rank_files`  the files a rank writes in its world's directory (captured
  output, stack dumps, crash dumps): their paths, and how each is written and read
* :mod:`~harness.protocol.failures`    how a failure on a rank is described (built from an
  exception, or from how a process ended) and rendered for a reader
* :mod:`~harness.protocol.traces`      the collectives a rank issued during a call, and how
  they read in a report
* :mod:`~harness.protocol.schedules`   where a call's ranks are held back at collective
  boundaries, what each hold did, a seed's holds
* :mod:`~harness.protocol.devices`     the GPUs of a world's lease as each rank sees them, and
  which is its own

Nothing here imports torch, pytest or any other part of the harness (an import-linter contract
in ``pyproject.toml`` enforces it), so both sides can rely on it and it can be read on its own.
"""
