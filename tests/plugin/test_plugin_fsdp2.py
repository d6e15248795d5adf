"""FSDP2 (``torch.distributed.fsdp.fully_shard``) on CPU Gloo: the all-gathers of its
forward and backward and the reduce-scatters of its gradients appear in the ``collectives``
fixture, at the lines that ran them. Real ranks, real Gloo, through pytester."""

from __future__ import annotations

import importlib

import pytest
from plugin_testutil import reports


def _has_fully_shard() -> bool:
    try:
        fsdp = importlib.import_module("torch.distributed.fsdp")
    except ImportError:
        return False
    return hasattr(fsdp, "fully_shard")


pytestmark = pytest.mark.skipif(
    not _has_fully_shard(), reason="this torch has no torch.distributed.fsdp.fully_shard (FSDP2)"
)


def _line(source: str, marker: str) -> int:
    """The line of ``source`` (a test file's text) that holds ``marker``, from 1."""
    return next(n for n, text in enumerate(source.splitlines(), 1) if marker in text)


FSDP_STEP = """\
import pytest
import torch
from torch.distributed.fsdp import fully_shard


@pytest.mark.distributed(world_size=2)
def test_fsdp_step(rank, collectives):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    try:
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"fully_shard does not run on CPU Gloo with this torch: {{exc}}")
    loss = model(torch.ones(3, 4)).sum()  # forward
    loss.backward()  # backward
    seen = [(c.op.split("_")[0] + "_" + c.op.split("_")[1], c.site) for c in collectives]
    forward, backward = "test_fsdp.py:{forward}", "test_fsdp.py:{backward}"
    # Each layer's parameters gathered for its forward, again for its backward (resharded
    # after forward), then its gradients reduce-scattered.
    assert seen == [
        ("all_gather", forward),
        ("all_gather", forward),
        ("all_gather", backward),
        ("all_gather", backward),
        ("reduce_scatter", backward),
        ("reduce_scatter", backward),
    ], [(c.op, c.site, c.shapes) for c in collectives]
"""


def test_an_fsdp2_step_lists_its_all_gathers_and_reduce_scatters(
    pytester: pytest.Pytester,
) -> None:
    source = FSDP_STEP.format(
        forward=_line(FSDP_STEP, "# forward"), backward=_line(FSDP_STEP, "# backward")
    )
    pytester.makepyfile(test_fsdp=source)
    result = pytester.runpytest("--dist-timeout=600", "-rs")
    report = reports(result)["test_fsdp_step"]
    if report.skipped:
        pytest.skip(str(report.longrepr))
    result.assert_outcomes(passed=1)


FSDP_EXTRA_FORWARD = """\
import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


@pytest.mark.distributed(world_size=2)
def test_extra_forward(rank):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    model(torch.ones(3, 4)).sum().backward()
    if rank == 0:  # rank 0 evaluates once more
        model(torch.ones(3, 4))  # extra
    dist.barrier()  # barrier
"""


def test_an_fsdp2_forward_on_one_rank_names_its_all_gather(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_fsdp=FSDP_EXTRA_FORWARD)
    result = pytester.runpytest("--dist-timeout=600")
    report = reports(result)["test_extra_forward"]
    result.assert_outcomes(failed=1)
    text = str(report.longrepr)
    extra = _line(FSDP_EXTRA_FORWARD, "# extra")
    barrier = _line(FSDP_EXTRA_FORWARD, "# barrier")
    # Both ranks wait in collectives that differ: that mismatch, reported when it is seen.
    assert text.splitlines()[0].startswith("CollectiveMismatch: the ranks' collectives do n"), text
    # The first layer's parameters gathered again on rank 0 (4 x 8 weights and 8 biases,
    # half on each rank), against rank 1's barrier.
    lines = [line for line in text.splitlines() if " on the default group differs: " in line]
    assert lines, text
    assert "differs: rank 0 all_gather" in lines[0], text
    assert (
        f"float32[20]) at test_fsdp.py:{extra}; rank 1 barrier() at test_fsdp.py:{barrier}"
        in lines[0]
    ), lines[0]
