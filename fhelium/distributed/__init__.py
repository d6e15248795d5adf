"""Default process group, torchrun environment and rank-local device.

``init`` creates the default process group (a world-size-one program needs no rendezvous),
``shutdown`` destroys a group, ``local_device`` names this rank's device.
"""

from fhelium.distributed._state import init, local_device, shutdown

__all__ = ["init", "local_device", "shutdown"]
