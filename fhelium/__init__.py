"""fhelium: an exact layer over torch.distributed (:mod:`fhelium.distributed`).

The multi-process test harness ships in the same distribution as the top-level package
:mod:`harness`.
"""

__version__ = "0.1.0"
