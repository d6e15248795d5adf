"""Shared by the whole suite.

pytester's in-process runs snapshot ``sys.modules`` and drop every module first imported
during an inner run. The harness imports its controller modules lazily (so that the plugin
loads without torch); if an inner run were the first to import them, later tests would hold
classes from modules no longer in ``sys.modules`` and could not pickle them to their ranks.
torch's functional collectives (which DTensor and torch's test utilities import) register an
operator library when imported, which a second import refuses: an inner run of a docs
example must not be the first to import them either. Importing both here, before any test
runs, keeps one copy for the whole session.
"""

import torch.testing._internal.common_distributed  # noqa: F401

import harness.controller.world
import harness.plugin.session  # noqa: F401
