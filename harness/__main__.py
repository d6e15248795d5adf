"""``python -m harness``: the harness's command line (see :mod:`harness.cli`)."""

import sys

from harness.cli import main

# The guard matters: forkserver and spawn re-import the main module in each new process
# (as ``__mp_main__``), and that import must not start another check.
if __name__ == "__main__":
    sys.exit(main())
