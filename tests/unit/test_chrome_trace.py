"""``trace.json``: a timeline as Chrome trace events, checked as a trace viewer reads them
(required keys, one flow per cross-rank collective binding to the slices it joins, time order
per thread) on the hand-made samples."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

import pytest
from timeline_samples import DEFAULT, EVENS, big, hang, mismatch, span, without

from harness.timeline.chrome_trace import CATEGORY, document
from harness.timeline.model import Timeline

SAMPLES = {"mismatch": mismatch, "hang": hang, "big": big}

REQUIRED = {
    "M": {"name", "ph", "pid", "args"},
    "X": {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"},
    "s": {"name", "cat", "ph", "id", "ts", "pid", "tid"},
    "t": {"name", "cat", "ph", "id", "ts", "pid", "tid", "bp"},
    "f": {"name", "cat", "ph", "id", "ts", "pid", "tid", "bp"},
    "i": {"name", "ph", "ts", "pid", "tid", "s"},
}


def _events(timeline: Timeline, ph: str | None = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = document(timeline)["traceEvents"]
    return [e for e in events if ph is None or e["ph"] == ph]


def _flows(timeline: Timeline) -> dict[int, list[dict[str, Any]]]:
    flows = defaultdict(list)
    for event in _events(timeline):
        if event["ph"] in "stf":
            flows[event["id"]].append(event)
    return flows


@pytest.mark.parametrize("sample", SAMPLES)
def test_the_document_is_plain_json(sample: str) -> None:
    doc = document(SAMPLES[sample]())
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
    assert doc["displayTimeUnit"] == "ms"
    assert doc["otherData"]["test"] == SAMPLES[sample]().test


@pytest.mark.parametrize("sample", SAMPLES)
def test_every_event_has_the_keys_of_its_phase(sample: str) -> None:
    for event in _events(SAMPLES[sample]()):
        assert REQUIRED[event["ph"]] <= set(event), event
        if event["name"].startswith("thread_"):
            assert "tid" in event
        if event["ph"] in "tf":
            assert event["bp"] == "e"
        if event["ph"] == "X":
            assert event["dur"] > 0


@pytest.mark.parametrize("sample", SAMPLES)
def test_timestamps_never_go_back_on_a_thread(sample: str) -> None:
    last: dict[tuple[int, int], float] = {}
    for event in _events(SAMPLES[sample]()):
        if event["ph"] == "M":
            continue
        track = event["pid"], event["tid"]
        assert event["ts"] >= last.get(track, 0.0), event
        last[track] = event["ts"]


@pytest.mark.parametrize("sample", SAMPLES)
def test_one_flow_per_cross_rank_collective(sample: str) -> None:
    timeline = SAMPLES[sample]()
    entered = Counter(s.key for s in timeline.spans if s.start is not None)
    cross_rank = {key for key, count in entered.items() if count > 1}
    flows = _flows(timeline)
    assert len(flows) == len(cross_rank)
    joined = set()
    for events in flows.values():
        phases = Counter(e["ph"] for e in events)
        assert phases["s"] == 1, events
        assert phases["f"] == 1, events
        assert phases["t"] == len(events) - 2
        assert len({e["pid"] for e in events}) == len(events)  # one event per rank
        assert {e["cat"] for e in events} == {CATEGORY}
        assert len({e["name"] for e in events}) == 1
        joined.add(events[0]["id"])
    assert len(joined) == len(flows)


@pytest.mark.parametrize("sample", SAMPLES)
def test_a_flow_event_sits_at_the_start_of_the_slice_it_binds_to(sample: str) -> None:
    slices = _events(SAMPLES[sample](), "X")
    for events in _flows(SAMPLES[sample]()).values():
        seqs = set()
        for event in events:
            bound = [
                s
                for s in slices
                if (s["pid"], s["tid"], s["cat"], s["ts"])
                == (event["pid"], event["tid"], event["cat"], event["ts"])
            ]
            assert len(bound) == 1, event
            assert bound[0]["ts"] <= event["ts"] < bound[0]["ts"] + bound[0]["dur"]
            seqs.add((bound[0]["args"]["group"], bound[0]["args"]["seq"]))
        assert len(seqs) == 1  # every event of a flow binds to the same collective


def test_a_flow_follows_the_ranks_arrival() -> None:
    for events in _flows(mismatch()).values():
        times = [e["ts"] for e in events]
        assert times == sorted(times)
        assert events[0]["ph"] == "s"
        assert events[-1]["ph"] == "f"
    first = next(iter(_flows(mismatch()).values()))
    assert [e["pid"] for e in first] == [0, 1, 2, 3]  # the sample's ranks arrive in order


def test_ranks_are_processes_and_groups_their_threads() -> None:
    meta = _events(mismatch(), "M")
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert names == {rank: f"rank {rank}" for rank in range(4)}
    order = {e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"}
    assert order == {rank: rank for rank in range(4)}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert threads == {
        **{(rank, 1): DEFAULT.name for rank in range(4)},
        (0, 2): EVENS.name,
        (2, 2): EVENS.name,
    }


def test_a_slice_says_what_was_called() -> None:
    marked = [e for e in _events(mismatch(), "X") if e["pid"] == 3 and e["args"]["seq"] == 3]
    assert len(marked) == 1
    args = marked[0]["args"]
    assert marked[0]["name"] == "all_gather(float32[4])"
    assert args["op"] == "all_gather"
    assert args["shapes"] == [[4]]
    assert args["dtype"] == "float32"
    assert args["reduce_op"] is None
    assert args["site"] == "test_model.py:13"
    assert args["state"] == "completed"
    assert args["group"] == DEFAULT.name
    assert args["mark"] == mismatch().mark_text
    assert marked[0]["ts"] == pytest.approx(33000.0)
    assert marked[0]["dur"] == pytest.approx(5000.0)


def test_the_mark_is_a_global_instant_where_its_collective_began() -> None:
    (mark,) = [e for e in _events(mismatch(), "i") if e["s"] == "g"]
    assert mark["name"] == mismatch().mark_text
    assert mark["ts"] == pytest.approx(30000.0)  # rank 0 entered #3 first
    assert mark["args"]["seq"] == 3
    assert mark["args"]["failure"] == mismatch().failure
    assert document(mismatch())["otherData"]["failure"] == mismatch().failure


def test_in_flight_slices_last_to_the_end_of_the_trace() -> None:
    timeline = hang()
    in_flight = [e for e in _events(timeline, "X") if e["args"]["state"] == "in flight"]
    assert {(e["pid"], e["args"]["seq"]) for e in in_flight} == {(0, 2), (1, 3), (2, 3)}
    for event in in_flight:
        assert event["ts"] + event["dur"] == pytest.approx(timeline.duration * 1e6)
        assert event["args"]["ended"] is False
        assert "still in flight" in event["args"]["note"]


def test_never_reached_collectives_are_instants_on_the_rank_that_missed_them() -> None:
    missed = [e for e in _events(hang(), "i") if e["s"] == "t"]
    where = {(e["pid"], e["tid"], e["args"]["seq"]): e["ts"] for e in missed}
    # Rank 1 entered default #3 first (at 31 ms), rank 0 the group of 0 and 2's #2 (20 ms).
    assert where == pytest.approx({(0, 1, 3): 31000.0, (3, 1, 3): 31000.0, (2, 2, 2): 20000.0})
    assert all(e["name"].startswith("never reached: ") for e in missed)
    # A collective one rank entered has no flow.
    assert len(_flows(hang())) == 4


def test_the_big_sample_has_one_slice_per_collective_and_rank() -> None:
    phases = Counter(e["ph"] for e in _events(big()))
    assert phases == {"M": 8 * 4, "X": 8 * 200, "s": 200, "t": 6 * 200, "f": 200}


def test_overlapping_spans_on_one_thread_are_cut_to_nest() -> None:
    base = mismatch()
    spans = (
        span(0, DEFAULT, 1, start=0.010, end=0.030),
        span(0, DEFAULT, 2, start=0.020, end=0.025),
    )
    timeline = Timeline("t", "", 1, "gloo", (DEFAULT,), spans, origin=base.origin)
    first, second = _events(timeline, "X")
    assert first["ts"] + first["dur"] == pytest.approx(second["ts"])


def test_a_rank_without_a_trace_is_named_so() -> None:
    timeline = without(mismatch(), 3)
    meta = _events(timeline, "M")
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert names[3] == "rank 3 (no trace)"
    assert document(timeline)["otherData"]["ranks_unknown"] == [3]
