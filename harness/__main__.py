"""``python -m harness``: the harness's command line (see :mod:`harness.cli`)."""

import os
import sys

from harness.cli import main


def keep_stdout_for_the_report() -> None:
    """Send what is written to file descriptor 1 to stderr, and ``sys.stdout`` to stdout.

    The ranks, started from this process, inherit its descriptors, and torch's C++ code in
    them writes to descriptor 1 (Gloo, in several torch releases, prints a ``[Gloo] Rank N is
    connected to M peer ranks`` line per group). A script that reads the report from stdout
    would get those lines inside the table; from here on they go to stderr, beside the
    harness's own messages, and only what Python prints through ``sys.stdout`` reaches stdout.
    """
    sys.stdout.flush()
    report = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(report, "w", buffering=1, encoding=sys.stdout.encoding)


# The guard matters: forkserver and spawn re-import the main module in each new process
# (as ``__mp_main__``), and that import must not start another check.
if __name__ == "__main__":
    keep_stdout_for_the_report()
    sys.exit(main())
