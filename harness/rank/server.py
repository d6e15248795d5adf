"""The forkserver's first preload (:mod:`harness.controller.forkserver`): importing it sets up
that process before it imports torch. Nothing else imports it.

* Its name in ``ps``: ``harness forkserver`` (each rank forked from it then names itself:
  :func:`harness.rank.entry.rank_main`).
"""

from harness.rank.title import set_title

set_title("harness forkserver")
