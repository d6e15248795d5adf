"""Collectives issued below ``torch.distributed``'s functions: DDP's, DTensor's, functional
and compiled ones. Where torch has process-group hooks (>= 2.14) they are recorded through
them; on older torch the functional collectives (DTensor's) through wrappers, DDP's not at
all. Each planted desync fails with a verdict naming each rank's collective and its site
(hangs are bounded only as a safety: the verdict, not the time, is asserted); the
``collectives`` fixture lists them, and a kill sweep counts them. Real ranks, real Gloo."""

from __future__ import annotations

import pytest
from plugin_testutil import reports

from harness import compat

HOOKS = compat.collective_hooks_available()
needs_hooks = pytest.mark.skipif(
    not HOOKS, reason="torch < 2.14 has no process-group hooks: DDP's collectives go unseen"
)


def _line(source: str, marker: str) -> int:
    """The line of ``source`` (a test file's text) that holds ``marker``, from 1."""
    return next(n for n, text in enumerate(source.splitlines(), 1) if marker in text)


DDP_EXTRA_STEP = """\
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


@pytest.mark.distributed(world_size=2)
def test_extra_step(rank):
    model = DDP(torch.nn.Linear(4, 2))
    for _ in range(3 if rank == 0 else 2):  # rank 0 takes one step too many
        model(torch.ones(3, 4)).sum().backward()  # backward
    dist.barrier()  # barrier
"""


@needs_hooks
def test_ddp_extra_backward_names_the_all_reduce_and_the_barrier(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_ddp=DDP_EXTRA_STEP)
    result = pytester.runpytest("--dist-timeout=600")
    result.assert_outcomes(failed=1)
    text = str(reports(result)["test_extra_step"].longrepr)
    backward = _line(DDP_EXTRA_STEP, "# backward")
    barrier = _line(DDP_EXTRA_STEP, "# barrier")
    # Two warm steps (the second's forward rebuilds DDP's buckets), then rank 0's third
    # backward meets rank 1's barrier.
    verdict = (
        "on the default group differs: rank 0 all_reduce(float32[10]) in backward (DDP) at "
        f"test_ddp.py:{backward}; rank 1 barrier() at test_ddp.py:{barrier}"
    )
    assert verdict in text, text
    assert "WorldTimeout: the run did not finish" not in text
    assert "all_reduce(float32[10]) in backward (DDP) at" in text.split("- collectives -")[1]


DTENSOR_ONE_RANK = """\
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


@pytest.mark.distributed(world_size=2)
def test_redistribute(rank):
    mesh = init_device_mesh("cpu", (2,))
    sharded = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    if rank == 0:
        sharded.redistribute(mesh, [Replicate()]).to_local()  # redistribute
    dist.barrier()  # barrier
"""


def test_dtensor_redistribute_on_one_rank_names_its_all_gather(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_dtensor=DTENSOR_ONE_RANK)
    result = pytester.runpytest("--dist-timeout=600")
    result.assert_outcomes(failed=1)
    text = str(reports(result)["test_redistribute"].longrepr)
    redistribute = _line(DTENSOR_ONE_RANK, "# redistribute")
    barrier = _line(DTENSOR_ONE_RANK, "# barrier")
    # The all-gather's name depends on torch's version (all_gather_into_tensor, or its
    # coalesced form through the hooks). distribute_tensor's scatter before it goes through
    # torch.distributed.scatter: unseen where a preloaded module took that by name.
    lines = [line for line in text.splitlines() if " on the default group differs: " in line]
    assert lines, text
    assert "differs: rank 0 all_gather" in lines[0]
    assert f"float32[4]){' in DTensor.redistribute' if HOOKS else ''} at " in lines[0]
    assert (
        f"at test_dtensor.py:{redistribute}; rank 1 barrier() at test_dtensor.py:{barrier}"
        in lines[0]
    )
    assert "WorldTimeout: the run did not finish" not in text


FUNCTIONAL_TWICE = """\
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


@pytest.mark.distributed(world_size=2)
def test_twice(rank):
    total = funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD)  # first
    if rank == 0:
        total = funcol.all_reduce(total, "sum", dist.group.WORLD)  # second
    assert total.sum() > 0
"""


def test_a_functional_all_reduce_issued_twice_on_one_rank_is_named(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_functional=FUNCTIONAL_TWICE)
    result = pytester.runpytest("--dist-timeout=600")
    result.assert_outcomes(failed=1)
    text = str(reports(result)["test_twice"].longrepr)
    assert text.splitlines()[0].startswith("WorldHang: the run can never finish"), text
    assert "rank 1 finished the call after #1; rank 0 waits in #2 (all_reduce)" in text
    second = _line(FUNCTIONAL_TWICE, "# second")
    read = "all_reduce(float32[3]) in functional all_reduce" if HOOKS else "all_reduce(SUM, "
    assert f"#2 {read}" in text
    assert f"at test_functional.py:{second}  [in flight]" in text


FUNCTIONAL_WAITED = """\
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


@pytest.mark.distributed(world_size=2)
def test_waited(rank):
    funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD).wait()  # waited
    funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD)  # returned
    assert rank == 0
"""


def test_a_functional_collective_that_returned_is_not_shown_in_flight(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_functional=FUNCTIONAL_WAITED)
    result = pytester.runpytest("--dist-timeout=600")
    result.assert_outcomes(failed=1)
    section = str(reports(result)["test_waited"].longrepr).split("- collectives -")[1]
    lines = section.splitlines()
    waited = _line(FUNCTIONAL_WAITED, "# waited")
    firsts = [line for line in lines if "#1 " in line]  # one per rank
    assert len(firsts) == 2, section
    assert all(line.endswith(f"at test_functional.py:{waited}") for line in firsts), section
    if not HOOKS:  # never waited for: issued, as an async_op=True call (the hooks read its Work)
        returned = _line(FUNCTIONAL_WAITED, "# returned")
        seconds = [line for line in lines if "#2 " in line]
        assert len(seconds) == 2, section
        assert all(line.endswith(f":{returned}  [issued]") for line in seconds), section


LISTED = """\
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP


@pytest.mark.distributed(world_size=2)
def test_ddp_step(rank, collectives):
    model = DDP(torch.nn.Linear(4, 2))  # made
    model(torch.ones(3, 4)).sum().backward()  # stepped
    seen = [(c.op, c.origin, c.site.split(":")[1]) for c in collectives]
    assert seen[-1] == ("all_reduce", "backward (DDP)", "{stepped}"), seen
    assert [op for op, _, _ in seen] == ["all_gather", "broadcast", "broadcast", "all_reduce"]
    assert all(origin == "DistributedDataParallel()" for _, origin, _ in seen[:3]), seen
    assert collectives[-1].async_op and collectives[-1].reduce_op is None


@pytest.mark.distributed(world_size=2)
def test_redistribute(rank, collectives):
    mesh = init_device_mesh("cpu", (2,))
    sharded = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])  # distributed
    sharded.redistribute(mesh, [Replicate()]).to_local()  # replicated
    seen = [(c.op, c.site.split(":")[1], c.shapes) for c in collectives]
    # The scatter is unseen where a module preloaded in the forkserver took
    # torch.distributed.scatter by name (see docs/limitations.md).
    if seen[0][0] == "scatter":
        assert seen.pop(0) == ("scatter", "{distributed}", ((4,),)), seen
    assert len(seen) == 1 and seen[0][0].startswith("all_gather"), seen
    assert seen[0][1:] == ("{replicated}", ((4,),)), seen
"""


def test_the_collectives_fixture_lists_a_ddp_step_and_a_redistribute(
    pytester: pytest.Pytester,
) -> None:
    source = LISTED.format(
        **{key: _line(LISTED, f"# {key}") for key in ("stepped", "distributed", "replicated")}
    )
    pytester.makepyfile(test_listed=source)
    result = pytester.runpytest("--dist-timeout=600", "-p", "no:randomly")
    if HOOKS:
        result.assert_outcomes(passed=2)
    else:  # DDP's collectives are not seen there
        result.assert_outcomes(passed=1, failed=1)
        assert reports(result)["test_redistribute"].passed


SWEPT = """\
import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from harness import faults


@pytest.mark.distributed(world_size=2, faults=faults.sweep("kill", ranks=[0], at="all"))
def test_step(rank):
    model = DDP(torch.nn.Linear(4, 2))
    model(torch.ones(3, 4)).sum().backward()
"""


@needs_hooks
def test_a_kill_sweep_over_a_ddp_step_has_a_case_per_collective(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_swept=SWEPT)
    result = pytester.runpytest("-p", "no:randomly", "--collect-only", "-q")
    cases = [line for line in result.stdout.lines if "test_step[kill-r0-at" in line]
    # DDP's construction (all_gather, 2 broadcasts) and its gradient all-reduce.
    assert len(cases) >= 4, result.stdout.str()


COMPILED = """\
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from harness import compat


def doubled_sum(x):  # compiled
    return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1  # issued


@pytest.mark.distributed(world_size=2)
def test_compiled(rank, collectives):
    compiled = torch.compile(doubled_sum, backend="aot_eager")
    assert compiled(torch.ones(4)).tolist() == [5.0] * 4
    seen = [(c.op, c.origin, c.site) for c in collectives]
    # The graph calls torch's ops directly: only the hooks see its collective, in the
    # compiled function (whose frame runs the compiled code: torch says which of its lines).
    if compat.collective_hooks_available():
        sites = ["test_compiled.py:{compiled}", "test_compiled.py:{issued}"]
        assert [(op, origin) for op, origin, _ in seen] == [("all_reduce", "compiled code")]
        assert seen[0][2] in sites, seen
    else:
        assert seen == [], seen
"""


def test_a_compiled_functional_collective_is_recorded_where_torch_has_hooks(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_compiled=COMPILED.format(
            compiled=_line(COMPILED, "# compiled"), issued=_line(COMPILED, "# issued")
        )
    )
    result = pytester.runpytest("--dist-timeout=600")
    result.assert_outcomes(passed=1)
