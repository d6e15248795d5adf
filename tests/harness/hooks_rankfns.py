"""Functions the process-group hook tests run inside ranks: groups made per call, a hook
whose recording fails, a DDP step for faults at its collectives, collectives that raise below
the Python functions."""

from __future__ import annotations

import datetime
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.nn.parallel import DistributedDataParallel as DDP


def groups_with_hooks() -> tuple[int, int]:
    """Make a group and issue a collective on it, then destroy it: how many groups the hooks
    are on, before and after."""
    from harness.rank.recording import hooks

    group = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(1), group=group)
    before = hooks.attached()
    dist.destroy_process_group(group)
    return before, hooks.attached()


def recording_that_fails() -> tuple[list[float], list[str]]:
    """A functional all_reduce whose recording raises: its result, and the warnings."""
    from harness.rank.recording import hooks

    def broken(*args: object) -> None:
        raise ValueError("a broken description")

    saved = hooks.note_below
    hooks.note_below = broken  # type: ignore[assignment]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            total = funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD).tolist()
    finally:
        hooks.note_below = saved
    return total, [str(warning.message) for warning in caught]


def ddp_step() -> list[float]:
    """Make a DDP model and take one step (collectives #1-#3 construct it, #4 is backward's)."""
    model = DDP(torch.nn.Linear(4, 2))  # made
    model(torch.ones(3, 4)).sum().backward()  # step
    return [p.grad.sum().item() for p in model.parameters() if p.grad is not None]


def one_all_reduce_two_ways() -> list[float]:
    """One all_reduce, through ``dist.all_reduce`` on rank 0 (its wrapper records the reduce
    op) and a functional one on rank 1 (below the Python functions: where torch's hooks
    record it, without one); its result."""
    tensor = torch.ones(3)
    if dist.get_rank() == 0:
        dist.all_reduce(tensor)
    else:
        tensor = funcol.wait_tensor(funcol.all_reduce(tensor, "sum", dist.group.WORLD))
    dist.barrier()
    return tensor.tolist()


def _states() -> list[tuple[str, str]]:
    """The op and state of each collective this call recorded so far."""
    from harness.rank import recording

    recorder = recording.current()
    assert recorder is not None
    return [(c.op.name, c.state) for c in recorder.trace().recent]


def raised_below_the_python_functions() -> tuple[str, list[tuple[str, str]]]:
    """A functional broadcast from a root outside the group, which torch's C++ refuses once
    the hooks saw it (their post hook never runs): the error, and the states recorded."""
    try:
        funcol.broadcast(torch.ones(2), 7, dist.group.WORLD)
    except RuntimeError as exc:
        error = str(exc)
    return error, _states()


def work_that_failed() -> list[tuple[str, str]]:
    """A functional all_reduce on rank 1 alone, on a group whose timeout its Work fails by
    (torch raises it in the wait, after the post hook): the states rank 1 recorded."""
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2))
    states = []
    if dist.get_rank() == 1:
        try:
            funcol.wait_tensor(funcol.all_reduce(torch.ones(2), "sum", group))
        except RuntimeError:
            states = _states()
    dist.destroy_process_group(group)
    return states


def ddp_extra_backward() -> None:
    """DDP, rank 0 taking one step more than rank 1, which waits in a barrier."""
    model = DDP(torch.nn.Linear(4, 2))
    for _ in range(3 if dist.get_rank() == 0 else 2):
        model(torch.ones(3, 4)).sum().backward()  # backward
    dist.barrier()


def flight_recorder_setting() -> tuple[str | None, int]:
    """The flight recorder's variable in this rank, and how many entries a DDP step left."""
    from harness import compat

    model = DDP(torch.nn.Linear(4, 2))
    model(torch.ones(3, 4)).sum().backward()
    return os.environ.get("TORCH_FR_BUFFER_SIZE"), len(compat.flight_recorder_entries())


def line_of(marker: str) -> str:
    """``hooks_rankfns.py:N``: the line of this file that holds ``# marker``."""
    with open(__file__) as source:
        found = next(n for n, text in enumerate(source, 1) if text.rstrip().endswith(f"# {marker}"))
    return f"hooks_rankfns.py:{found}"


def hooks_reinstalled() -> tuple[int, int, int]:
    """How many groups the hooks are on: now, once uninstalled, and installed again."""
    from harness.rank.recording import hooks

    before = hooks.attached()
    hooks.uninstall()
    after = hooks.attached()
    hooks.install()
    return before, after, hooks.attached()
