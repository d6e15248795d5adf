"""A schedule's holds acted out on real ranks: boundaries counted, a held rank kept back
until its peers are blocked (so the race it places is certain, whatever the load), the
order of two holds, a hold that lasts its delay, and what each trace says of them."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

import harness
from harness.protocol.messages import CallOptions
from harness.protocol.schedules import AFTER, BEFORE, BOUND, PEERS, WAIT, Schedule

# Long enough that a hold in these tests ends only when its peers are blocked: the bound
# catches a hang, never decides an outcome.
NEVER = 60.0


def _scheduled(holds: tuple[tuple[int, int], ...] = (), delay: float = NEVER) -> CallOptions:
    return CallOptions(120, schedule=Schedule(holds, delay), keep_traces=True)


def blocking_then_barrier() -> None:
    dist.all_reduce(torch.ones(2))
    dist.barrier()


def async_all_reduce() -> float:
    """Rank 0 reads its async result before waiting on it (the race); the other waits."""
    grad = torch.full((4,), float(dist.get_rank() + 1))
    work = dist.all_reduce(grad, async_op=True)
    total = grad.sum().item() if dist.get_rank() == 0 else 0.0
    work.wait()
    return total


def rank_1_looks_for_rank_0s_file(path: str) -> bool:
    """Rank 0 writes a file after collective #1; rank 1 looks for it before #2, and says
    whether it was there."""
    dist.all_reduce(torch.ones(1))
    seen = False
    if dist.get_rank() == 0:
        with open(path, "w") as handle:
            handle.write("saved")
    else:
        seen = os.path.exists(path)
    dist.barrier()
    if dist.get_rank() == 0:
        os.remove(path)
    return seen


def rank_1_waits_for_a_key(path: str) -> None:
    """Rank 1 waits for a store key that rank 0 sets after collective #1."""
    store = dist.FileStore(path, 2)
    dist.barrier()
    if dist.get_rank() == 0:
        store.set("ready", "1")
    else:
        store.wait(["ready"], datetime.timedelta(seconds=NEVER))


def test_each_rank_counts_the_boundaries_it_crosses(world2: harness.World) -> None:
    outcome = world2.call(blocking_then_barrier, options=_scheduled())
    assert outcome.error is None
    # Entering and returning from each of the two collectives.
    assert {rank: trace.boundaries for rank, trace in outcome.traces.items() if trace} == {
        0: 4,
        1: 4,
    }
    outcome = world2.call(async_all_reduce, options=_scheduled())
    # An async collective adds the start of its wait.
    assert {rank: trace.boundaries for rank, trace in outcome.traces.items() if trace} == {
        0: 3,
        1: 3,
    }
    plain = world2.call(blocking_then_barrier, options=CallOptions(120, keep_traces=True))
    assert all(trace is not None and trace.boundaries == 0 for trace in plain.traces.values())


def test_a_held_rank_stays_behind_until_its_peer_is_blocked(
    world2: harness.World, tmp_path: object
) -> None:
    path = os.path.join(str(tmp_path), "saved")
    # Rank 0 held after collective #1 returned (its boundary 2): rank 1 has looked for the
    # file and entered the barrier before rank 0 writes it, every time.
    for _ in range(3):
        outcome = world2.call(rank_1_looks_for_rank_0s_file, (path,), options=_scheduled(((0, 2),)))
        assert outcome.error is None
        assert outcome.values == [False, False]
        trace = outcome.traces[0]
        assert trace is not None
        (held,) = trace.held
        assert (held.rank, held.at, held.point, held.until) == (0, 2, AFTER, PEERS)
        assert held.collective == "collective #1 (all_reduce)"
        assert held.site.startswith("test_harness_schedules.py:")
        assert str(held).startswith(
            "rank 0 held at boundary 2, after collective #1 (all_reduce) at "
            "test_harness_schedules.py:"
        )
    # Held after the barrier instead, rank 0 has written before rank 1 looks.
    outcome = world2.call(rank_1_looks_for_rank_0s_file, (path,), options=_scheduled(((1, 2),)))
    assert outcome.values == [False, True]


def test_a_hold_before_a_collective_makes_an_async_read_early(world2: harness.World) -> None:
    # Rank 1 held before it enters the all-reduce: rank 0 reads its own value alone.
    for _ in range(3):
        outcome = world2.call(async_all_reduce, options=_scheduled(((1, 1),)))
        assert outcome.error is None
        assert outcome.values is not None
        assert outcome.values[0] == 4.0
        trace = outcome.traces[1]
        assert trace is not None
        assert [(h.point, h.until) for h in trace.held] == [(BEFORE, PEERS)]
    # Rank 0 held before its wait: a boundary of its own.
    outcome = world2.call(async_all_reduce, options=_scheduled(((0, 3),)))
    trace = outcome.traces[0]
    assert trace is not None
    assert [(h.at, h.point) for h in trace.held] == [(3, WAIT)]
    assert trace.held[0].collective == "collective #1 (all_reduce)"


def test_of_two_holds_the_one_placed_first_stays_behind(world2: harness.World) -> None:
    # Rank 1 is held first (boundary 1, before the all-reduce), rank 0 second (boundary 2,
    # once it issued its async all-reduce): rank 0 goes on past rank 1's hold, so rank 1
    # still enters late and rank 0 reads its own value alone.
    for _ in range(3):
        outcome = world2.call(async_all_reduce, options=_scheduled(((1, 1), (0, 2))))
        assert outcome.error is None
        assert outcome.values is not None
        assert outcome.values[0] == 4.0
        assert all(
            held.until == PEERS
            for trace in outcome.traces.values()
            if trace is not None
            for held in trace.held
        )


def test_a_hold_whose_peer_waits_outside_collectives_lasts_its_delay(
    world2: harness.World, tmp_path: object
) -> None:
    path = os.path.join(str(tmp_path), "store")
    # Rank 0 held after the barrier, where rank 1 waits on a store key rank 0 sets: rank 1
    # is never blocked in a collective, so the hold ends at its delay, and the key is set.
    outcome = world2.call(rank_1_waits_for_a_key, (path,), options=_scheduled(((0, 2),), 0.2))
    assert outcome.error is None
    trace = outcome.traces[0]
    assert trace is not None
    (held,) = trace.held
    assert held.until == BOUND
    assert held.seconds >= 0.2


def test_a_hold_its_rank_never_reaches_does_nothing(world2: harness.World) -> None:
    outcome = world2.call(blocking_then_barrier, options=_scheduled(((0, 9), (5, 1))))
    assert outcome.error is None
    assert all(trace is not None and not trace.held for trace in outcome.traces.values())


def test_a_hold_ends_when_its_peer_is_done(world2: harness.World) -> None:
    # Rank 1 held after the barrier, its last boundary: rank 0 returns, and says so. The
    # call's own bound, shorter than the hold's delay, catches a hold that never ended.
    options = CallOptions(30, schedule=Schedule(((1, 4),), NEVER), keep_traces=True)
    outcome = world2.call(blocking_then_barrier, options=options)
    assert outcome.error is None
    trace = outcome.traces[1]
    assert trace is not None
    assert [(held.at, held.until) for held in trace.held] == [(4, PEERS)]


def test_a_failing_rank_ends_its_peers_hold(world2: harness.World) -> None:
    options = CallOptions(30, schedule=Schedule(((1, 4),), NEVER))
    outcome = world2.call(rank_0_fails_after_the_barrier, options=options)
    error = outcome.error
    assert isinstance(error, harness.RankError)
    assert list(error.failures) == [0]
    # Rank 1 went on once rank 0 was done: its trace says the hold ended there.
    trace = error.collectives[1]
    assert trace is not None
    assert [(held.at, held.until) for held in trace.held] == [(4, PEERS)]


def rank_0_fails_after_the_barrier() -> None:
    dist.all_reduce(torch.ones(1))
    dist.barrier()
    if dist.get_rank() == 0:
        raise ValueError("rank 0's own failure")


def ddp_steps() -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    dist.barrier()


def test_a_hold_at_ddps_collectives_ends_when_its_peer_issued_them(world2: harness.World) -> None:
    # On torch >= 2.14 DDP's collectives (its construction's, its backward's all-reduces)
    # are boundaries, whose waits torch does in C++: a peer that issued one counts as
    # waiting on it. The call's bound, shorter than a hold's delay, catches one that never
    # ended.
    counted = world2.call(ddp_steps, options=_scheduled())
    trace = counted.traces[1]
    assert trace is not None
    for at in range(1, trace.boundaries + 1):
        options = CallOptions(30, schedule=Schedule(((1, at),), NEVER), keep_traces=True)
        outcome = world2.call(ddp_steps, options=options)
        assert outcome.error is None
        held = outcome.traces[1]
        assert held is not None
        assert [(h.at, h.until) for h in held.held] == [(at, PEERS)]
