"""``fr/``: a timeline as torch Flight Recorder dumps, read back and analyzed by torch's own
analyzer (``torch.distributed.flight_recorder.fr_trace``'s command line, in a subprocess as a
user runs it), which must name the same first mismatch or hang as the timeline's mark.

The analyses share one subprocess (:func:`analysed`): each is a run of the command's own
``main`` on a directory, as ``python -m`` runs it, and torch's import is paid once.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from timeline_samples import DEFAULT, EVENS, big, hang, mismatch, span, without

from harness.protocol.traces import ISSUED, RAISED
from harness.timeline.flight_dumps import FILE_PREFIX, VERSION, dumps, write
from harness.timeline.model import NEVER_REACHED, Group, Span, Timeline

ENTRY_KEYS = {
    "record_id",
    "pg_id",
    "process_group",
    "collective_seq_id",
    "p2p_seq_id",
    "op_id",
    "profiling_name",
    "time_created_ns",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "output_dtypes",
    "state",
    "timeout_ms",
    "is_p2p",
    "frames",
    "retired",
}

# What the analyzer prints when a group's collectives all match: nothing of these.
FINDINGS = ("has errors", "Not all ranks joining", "MISMATCH", "mismatch", "Traceback")


_ANALYZER = """
import json
import sys
import traceback

from torch.distributed.flight_recorder.fr_trace import main

for index, argv in enumerate(json.loads(sys.argv[1])):
    status = 0
    try:
        main(argv)
    except SystemExit as exc:  # as python -m ends: its code, 0 for None
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:  # as python -m ends: the traceback, status 1
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.write(f"\\n@@fr_trace {index} exited {status}@@\\n")
    sys.stderr.flush()
"""


def fr_trace(*runs: list[str]) -> list[tuple[int, str]]:
    """torch's analyzer run on each ``[*flags, directory]`` of ``runs``, in one subprocess:
    each run's exit status and output (it logs to stderr)."""
    result = subprocess.run(
        [sys.executable, "-c", _ANALYZER, json.dumps(runs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,  # a safety bound only
        check=False,
    )
    assert result.returncode == 0, result.stdout
    found, output = [], result.stdout
    for index in range(len(runs)):
        before, marker, output = output.partition(f"@@fr_trace {index} exited ")
        assert marker, result.stdout
        status, _, output = output.partition("@@")
        found.append((int(status), before))
    return found


_NO_GLOO = "name formatting error?"
"""How an analyzer that reads NCCL and XCCL dumps only (torch 2.10's) rejects a Gloo one."""


def _analyzer_here() -> None:
    """Skip the test where this torch has no Flight Recorder analyzer (torch 2.8 has none)."""
    if importlib.util.find_spec("torch.distributed.flight_recorder") is None:
        pytest.skip(f"torch {torch.__version__} has no Flight Recorder analyzer")


def _reads_gloo(output: str) -> None:
    """Skip the test where this torch's analyzer rejected a Gloo world's dumps."""
    if _NO_GLOO in output:
        pytest.skip(f"torch {torch.__version__}'s analyzer reads NCCL and XCCL dumps only")


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """The analyzer's verdict on each sample, by name: (status, output, its directory)."""
    _analyzer_here()
    samples = {
        "incomplete": without(mismatch(), 1),
        "mismatch": mismatch(),
        "hang": hang(),
        "passing": big(4, 20),
        "every kind": _every_kind(),
        "size mismatch": Timeline("t", "", 4, "gloo", (DEFAULT,), _size_mismatch()),
    }
    runs = {name: ([], name) for name in samples}
    runs["incomplete, allowed"] = (["--allow-incomplete-ranks"], "incomplete")
    directories = {}
    for name, timeline in samples.items():
        directories[name] = tmp_path_factory.mktemp("fr")
        write(directories[name], timeline)
    results = fr_trace(*([*flags, str(directories[sample])] for flags, sample in runs.values()))
    _reads_gloo(results[list(runs).index("passing")][1])
    return {
        name: (status, output, directories[sample])
        for (name, (_, sample)), (status, output) in zip(runs.items(), results, strict=True)
    }


def _first_read(directory: Path) -> int:
    """The rank whose dump the analyzer reads first (the file system's order): the one it
    compares the others with."""
    return int(os.listdir(directory)[0].removeprefix(FILE_PREFIX))


def test_a_dump_per_rank_loads_back(tmp_path: Path) -> None:
    write(tmp_path / "fr", mismatch())
    assert sorted(os.listdir(tmp_path / "fr")) == [f"rank_{rank}" for rank in range(4)]
    expected = dumps(mismatch())
    for rank in range(4):
        dump = pickle.loads((tmp_path / "fr" / f"rank_{rank}").read_bytes())
        assert dump == expected[rank]
        assert dump["version"] == VERSION
        assert {"version", "pg_config", "pg_status", "entries"} <= set(dump)
        for entry in dump["entries"]:
            assert set(entry) >= ENTRY_KEYS, entry


def test_pg_config_names_the_groups_the_entries_name() -> None:
    for rank, dump in dumps(mismatch()).items():
        config = dump["pg_config"]
        for entry in dump["entries"]:
            name, desc = entry["process_group"]
            assert config[name]["name"] == name
            assert config[name]["desc"] == desc
        assert ast.literal_eval(config["0"]["ranks"]) == list(DEFAULT.ranks)
        if rank in EVENS.ranks:
            assert ast.literal_eval(config["1"]["ranks"]) == list(EVENS.ranks)
        else:
            assert "1" not in config  # a rank's dump lists only its own groups


def test_an_entry_is_the_collective_in_torchs_terms() -> None:
    entries = dumps(mismatch())[3]["entries"]
    assert [e["collective_seq_id"] for e in entries] == [1, 2, 3]
    assert [e["record_id"] for e in entries] == [0, 1, 2]
    gather = entries[2]
    assert gather["profiling_name"] == "gloo:all_gather"
    assert gather["process_group"] == ("0", "default_pg")
    assert gather["input_sizes"] == [[4]]
    assert gather["output_sizes"] == [[4, 4]]  # the group's size times the input
    assert gather["input_dtypes"] == gather["output_dtypes"] == ["Float"]
    assert gather["state"] == "completed"
    assert gather["retired"] is True
    assert gather["frames"] == [{"name": "all_gather", "filename": "test_model.py", "line": 13}]
    assert gather["time_created_ns"] == round((100.0 + 0.033) * 1e9)
    assert gather["time_discovered_completed_ns"] == round((100.0 + 0.038) * 1e9)
    assert gather["duration_ms"] == pytest.approx(5.0)
    evens = dumps(mismatch())[2]["entries"][2]
    assert evens["process_group"] == ("1", EVENS.name)
    assert evens["collective_seq_id"] == 1


def test_states_and_what_is_left_out() -> None:
    timeline = hang()
    by_rank = dumps(timeline)
    states = {
        (rank, e["process_group"][0], e["collective_seq_id"]): e["state"]
        for rank, dump in by_rank.items()
        for e in dump["entries"]
    }
    assert states[0, "1", 2] == "started"  # in flight
    assert (2, "1", 2) not in states  # never reached: no entry
    assert (0, "0", 3) not in states
    assert by_rank[0]["pg_status"]["1"] == {
        "last_enqueued_collective": 2,
        "last_started_collective": 2,
        "last_completed_collective": 1,
    }
    started = next(e for e in by_rank[1]["entries"] if e["state"] == "started")
    assert started["time_discovered_completed_ns"] is None
    assert "duration_ms" not in started
    other = (
        replace(span(0, DEFAULT, 1), state=ISSUED),
        replace(span(0, DEFAULT, 2), state=RAISED),
        Span(
            0,
            "",
            0,
            "send",
            "send(dst=1, float32[4])",
            ((4,),),
            "float32",
            None,
            "t.py:3",
            0.03,
            0.04,
            "completed",
        ),
    )
    one = Timeline("t", "", 1, "nccl", (Group("", "the default group", (0,)),), other)
    entries = dumps(one)[0]["entries"]
    assert [e["state"] for e in entries] == ["scheduled", "started"]  # send left out
    assert entries[0]["profiling_name"] == "nccl:all_reduce"


def test_a_rank_without_a_trace_has_no_dump(analysed: dict[str, tuple[int, str, Path]]) -> None:
    assert sorted(dumps(without(mismatch(), 1))) == [0, 2, 3]
    status, output, _ = analysed["incomplete"]
    assert status != 0
    assert "Missing dump files from ranks {1}" in output
    status, output, _ = analysed["incomplete, allowed"]
    assert status == 0, output
    assert "Collective sequence number: 3 has errors" in output


def test_fr_trace_names_the_mismatch(analysed: dict[str, tuple[int, str, Path]]) -> None:
    status, output, directory = analysed["mismatch"]
    assert status == 0, output
    assert "Collective sequence number: 3 has errors" in output
    assert "group info: 0:default_pg" in output
    assert "COLLECTIVE_TYPE_MISMATCH" in output
    # The analyzer compares every rank with the first dump it reads and names those that
    # differ from it: rank 3, or, where rank 3's dump came first, all the others.
    if _first_read(directory) == 3:
        expected, found, culprits = "all_gather", "all_reduce", [0, 1, 2]
    else:
        expected, found, culprits = "all_reduce", "all_gather", [3]
    assert f"collective: gloo:{expected}" in output
    assert (
        f"Expected collective type: '{expected}' does not match found collective type: '{found}'"
    ) in output
    named = sorted(int(part.split(";")[0]) for part in output.split("Culprit rank ")[1:])
    assert named == culprits
    assert output.count("has errors") == 1  # the first mismatch only: #3, nothing before


def test_read_in_rank_order_the_analyzer_names_rank_3(caplog: pytest.LogCaptureFixture) -> None:
    # The file system decides the order the command line reads the dumps in; the analyzer's
    # own entry point, given them in rank order, says rank 3 is the one that differs.
    _analyzer_here()
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig

    details = {
        f"{FILE_PREFIX}{rank}": {"rank": rank, "host_name": f"host_rank{rank}", **dump}
        for rank, dump in sorted(dumps(mismatch()).items())
    }
    with caplog.at_level("INFO", logger="Flight Recorder"):
        try:
            build_db(details, JobConfig().parse_args(["unused"]), VERSION)
        except AssertionError as exc:
            _reads_gloo(str(exc))
            raise
    output = caplog.text
    assert "Collective sequence number: 3 has errors" in output
    assert "collective: gloo:all_reduce" in output
    assert (
        "Culprit rank 3; Error type: COLLECTIVE_TYPE_MISMATCH, Expected collective type: "
        "'all_reduce' does not match found collective type: 'all_gather'"
    ) in output
    assert "Culprit rank 0" not in output


def test_fr_trace_names_the_hang(analysed: dict[str, tuple[int, str, Path]]) -> None:
    status, output, _ = analysed["hang"]
    assert status == 0, output
    # One report per group, in the order the analyzer meets them (that of the dumps).
    reports = output.split("Not all ranks joining collective, ")[1:]
    assert len(reports) == 2, output
    default, evens = sorted(reports, reverse=True)  # "sequence number: 3" first
    assert default.startswith("sequence number: 3")
    assert "group info: 0:default_pg" in default
    assert "missing ranks: {0, 3}" in default  # rank 0 is elsewhere, rank 3 returned
    assert "collective state: started" in default
    assert evens.startswith("sequence number: 2")
    assert f"group info: 1:{EVENS.name}" in evens
    assert "missing ranks: {2}" in evens
    assert "has errors" not in output


def test_fr_trace_finds_nothing_wrong_in_a_passing_call(
    analysed: dict[str, tuple[int, str, Path]],
) -> None:
    status, output, _ = analysed["passing"]
    assert status == 0, output
    assert not [finding for finding in FINDINGS if finding in output], output


def _every_kind() -> Timeline:
    """Two ranks calling every recorded collective alike, as the harness describes them."""
    group = Group("", "the default group", (0, 1))
    calls: list[tuple[str, str, tuple[tuple[int, ...], ...], str | None]] = [
        ("all_reduce", "all_reduce(SUM, float32[4])", ((4,),), "float32"),
        (
            "all_reduce_coalesced",
            "all_reduce_coalesced(SUM, float32[4], float32[2])",
            ((4,), (2,)),
            "float32",
        ),
        ("broadcast", "broadcast(src=0, int64[2, 3])", ((2, 3),), "int64"),
        ("reduce", "reduce(dst=0, SUM, float32[4])", ((4,),), "float32"),
        ("all_gather", "all_gather(float32[4])", ((4,),), "float32"),
        (
            "all_gather_into_tensor",
            "all_gather_into_tensor(float32[8], float32[4])",
            ((8,), (4,)),
            "float32",
        ),
        ("gather", "gather(dst=0, float32[4])", ((4,),), "float32"),
        ("scatter", "scatter(src=0, float32[4])", ((4,),), "float32"),
        (
            "reduce_scatter",
            "reduce_scatter(SUM, float32[4], float32[4], float32[4])",
            ((4,), (4,), (4,)),
            "float32",
        ),
        (
            "reduce_scatter_tensor",
            "reduce_scatter_tensor(SUM, float32[4], float32[8])",
            ((4,), (8,)),
            "float32",
        ),
        ("all_to_all", "all_to_all(float32[2], float32[2])", ((2,), (2,)), "float32"),
        ("all_to_all_single", "all_to_all_single(bfloat16[4])", ((4,),), "bfloat16"),
        ("barrier", "barrier()", (), None),
        ("broadcast_object_list", "broadcast_object_list(src=0, 3 objects)", (), None),
        ("all_gather_object", "all_gather_object(2 objects)", (), None),
        ("gather_object", "gather_object(dst=0)", (), None),
        ("scatter_object_list", "scatter_object_list(src=0)", (), None),
        ("monitored_barrier", "monitored_barrier()", (), None),
    ]
    spans = tuple(
        Span(
            rank,
            "",
            seq,
            op,
            text,
            shapes,
            dtype,
            None,
            f"t.py:{seq}",
            seq * 0.01,
            seq * 0.01 + 0.002,
            "completed",
        )
        for rank in (0, 1)
        for seq, (op, text, shapes, dtype) in enumerate(calls, 1)
    )
    return Timeline("t.py::test_kinds", "", 2, "gloo", (group,), spans)


def test_fr_trace_matches_every_kind_called_alike(
    analysed: dict[str, tuple[int, str, Path]],
) -> None:
    timeline = _every_kind()
    assert len(dumps(timeline)[0]["entries"]) == len(timeline.spans) // 2
    status, output, _ = analysed["every kind"]
    assert status == 0, output
    assert not [finding for finding in FINDINGS if finding in output], output


def _size_mismatch() -> tuple[Span, ...]:
    """Rank 1 all-reduces 8 elements where its peers all-reduce 4."""
    return (
        span(0, DEFAULT, 1),
        span(1, DEFAULT, 1, shape=(8,)),
        span(2, DEFAULT, 1),
        span(3, DEFAULT, 1),
    )


def test_fr_trace_names_a_size_mismatch(analysed: dict[str, tuple[int, str, Path]]) -> None:
    status, output, _ = analysed["size mismatch"]
    assert status == 0, output
    assert "Collective sequence number: 1 has errors" in output
    assert "SIZE_OR_SYNTAX_MISMATCH" in output


@pytest.mark.skipif(
    importlib.util.find_spec("tabulate") is None,
    reason="fr_trace -j needs the tabulate package (torch 2.13 raises NameError without it)",
)
def test_fr_trace_prints_the_entries(tmp_path: Path) -> None:
    _analyzer_here()
    write(tmp_path, mismatch())
    ((status, output),) = fr_trace(["-j", str(tmp_path)])
    _reads_gloo(output)
    assert status == 0, output
    assert "all_gather(input_sizes=[[4]], state=completed)" in output
    assert all(f"Rank {rank}" in output for rank in range(4))


def test_never_reached_spans_have_no_entry() -> None:
    lone = span(0, DEFAULT, 1, state=NEVER_REACHED)
    assert dumps(Timeline("t", "", 1, "gloo", (DEFAULT,), (lone,)))[0]["entries"] == []
