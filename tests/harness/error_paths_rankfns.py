"""Functions the error-path tests run inside ranks: a collective that raises on one rank
and is handled there, a real mismatch next to it, and a collective called from code that
imitates torch's own tests (a file under ``torch/testing``). Real Gloo, nothing mocked.

Lines the tests expect in a report carry a ``# <tag>`` comment; :func:`line_of` finds them.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from harness_testutil import tagged_line


def line_of(tag: str) -> str:
    """``error_paths_rankfns.py:N``: where the line tagged ``# <tag>`` is."""
    return tagged_line(__file__, tag)


def caught_bad_root() -> list[float]:
    """Rank 0 calls a broadcast from a root outside the world, which torch rejects on that
    rank only, and handles the error; then every rank all-reduces."""
    if dist.get_rank() == 0:
        try:
            dist.broadcast(torch.ones(4), src=dist.get_world_size() + 5)  # bad-root
        except (ValueError, RuntimeError):
            pass
        else:
            raise AssertionError("torch accepted a root outside the world")
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    return tensor.tolist()


def mismatch_before_a_caught_error() -> None:
    """A SUM against a MAX that both complete, then a collective that raises on rank 0 and
    is handled: the mismatch before it still counts."""
    op = dist.ReduceOp.SUM if dist.get_rank() == 0 else dist.ReduceOp.MAX
    dist.all_reduce(torch.ones(4), op=op)  # sum-max
    if dist.get_rank() == 0:
        try:
            dist.broadcast(torch.ones(4), src=dist.get_world_size() + 5)
        except (ValueError, RuntimeError):
            pass


TORCH_TESTING_FILE = os.path.join(
    os.path.dirname(os.path.abspath(torch.__file__)), "testing", "_internal", "fake_test.py"
)
"""A file name inside torch's own test code (which holds no such file)."""

_TORCH_TEST_SOURCE = """\
def torch_test_body(dist, torch):
    tensor = torch.ones(4) * (dist.get_rank() + 1)
    op = dist.ReduceOp.SUM if dist.get_rank() == 0 else dist.ReduceOp.MAX
    dist.all_reduce(tensor, op=op)
"""


def collective_from_torch_testing() -> None:
    """A mismatched all-reduce called from a function whose code claims to live in
    ``torch/testing/_internal`` (as PyTorch's own distributed tests do)."""
    namespace: dict[str, object] = {}
    exec(compile(_TORCH_TEST_SOURCE, TORCH_TESTING_FILE, "exec"), namespace)
    namespace["torch_test_body"](dist, torch)  # type: ignore[operator]
