"""The forkserver's first preload, which sets the process up.

It is the first preload of :mod:`harness.controller.forkserver`: importing it sets up that
process before it imports torch. Nothing else imports it.

* Its name in ``ps``: ``harness forkserver`` (each rank forked from it then names itself:
  :func:`harness.rank.entry.rank_main`).
* torch's warning that it cannot use NumPy is left to the controller, whose own import of
  torch prints it: the server shares its stderr, and would print it a second time.
"""

import warnings

from harness.rank.title import set_title

set_title("harness forkserver")
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
