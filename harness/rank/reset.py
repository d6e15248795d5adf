"""Putting back what one call changed in its rank.

A reused rank must look to each call as a fresh one would. :class:`ProcessState` is taken
once when the rank is up and restored after every call (``--dist-mptc`` tests included):
torch's default dtype, grad mode, deterministic-algorithms setting and intra-op thread
count, ``sys.path``, the root logger's level and handlers, the working directory,
``os.environ`` and torch.distributed's backend registry (what ``Backend.register_backend``
added). Warning filters are kept by running each call inside ``warnings.catch_warnings()``;
process groups are destroyed by :func:`destroy_groups`. :func:`seed_all` gives a call the
random numbers a fresh process seeded the same way would draw.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from harness import compat


@dataclass
class ProcessState:
    """The state a call may leave behind, as it was when the rank came up."""

    dtype: torch.dtype
    grad: bool
    deterministic: bool
    deterministic_warn_only: bool
    threads: int
    sys_path: list[str]
    cwd: str
    environ: dict[bytes, bytes]
    log_level: int
    log_handlers: list[logging.Handler] = field(default_factory=list)
    backends: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def capture(cls) -> ProcessState:
        root = logging.getLogger()
        return cls(
            dtype=torch.get_default_dtype(),
            grad=torch.is_grad_enabled(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            threads=torch.get_num_threads(),
            sys_path=list(sys.path),
            cwd=os.getcwd(),
            environ=dict(compat.environ_bytes()),
            log_level=root.level,
            log_handlers=list(root.handlers),
            backends=compat.backend_registry(),
        )

    def restore(self) -> None:
        """Put everything back. Only what differs is touched: this runs after every call."""
        if torch.get_default_dtype() != self.dtype:
            torch.set_default_dtype(self.dtype)
        if torch.is_grad_enabled() != self.grad:
            torch.set_grad_enabled(self.grad)
        if (
            torch.are_deterministic_algorithms_enabled() != self.deterministic
            or torch.is_deterministic_algorithms_warn_only_enabled() != self.deterministic_warn_only
        ):
            torch.use_deterministic_algorithms(
                self.deterministic, warn_only=self.deterministic_warn_only
            )
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if sys.path != self.sys_path:
            sys.path[:] = self.sys_path
        root = logging.getLogger()
        if root.level != self.log_level:
            root.setLevel(self.log_level)
        if root.handlers != self.log_handlers:
            root.handlers[:] = self.log_handlers
        _restore_environ(self.environ)
        # A backend one call registered must not be available to the next
        # (is_backend_available reads the registry).
        compat.restore_backend_registry(self.backends)
        if os.getcwd() != self.cwd:
            os.chdir(self.cwd)


def _restore_environ(saved: dict[bytes, bytes]) -> None:
    # Compared as the bytes os.environ keeps: equal (one C-level comparison) after some
    # calls, and otherwise the variables that differ are found by set operations on the
    # dicts' views (a call changes one or two of a hundred), and only those decoded and set.
    now = compat.environ_bytes()
    if now == saved:
        return
    for key in now.keys() - saved.keys():
        del os.environ[os.fsdecode(key)]
    for key, value in saved.items() - now.items():
        os.environ[os.fsdecode(key)] = os.fsdecode(value)


def update_environ(wanted: Mapping[str, str | None], *, exact: bool = False) -> None:
    """Set (None: unset) the variables in ``wanted``; with ``exact``, unset every other.

    Only what differs is touched: setting a whole environment is slow.
    """
    if exact:
        for key in [key for key in os.environ if key not in wanted]:
            del os.environ[key]
    for key, value in wanted.items():
        if value is None:
            os.environ.pop(key, None)
        elif os.environ.get(key) != value:
            os.environ[key] = value


def seed_all(seed: int) -> None:
    """Seed torch (CPU and every CUDA device), ``random`` and numpy's global generator."""
    # Not torch.manual_seed: it also visits the MPS, XPU and custom-device backends, a cost
    # paid at every test; the CPU and CUDA generators are these.
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)  # queued until CUDA initializes, if it has not yet
    random.seed(seed)
    numpy: Any = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


def destroy_groups(keep: set[Any] | frozenset[Any] = frozenset()) -> None:
    """Destroy every process group not in ``keep``: subgroups, then the default one if not kept."""
    if not dist.is_initialized():
        return
    default = dist.group.WORLD
    for group in [*(compat.live_process_groups() - keep - {default}), default]:
        if group not in keep:
            with contextlib.suppress(Exception):
                dist.destroy_process_group(group)
