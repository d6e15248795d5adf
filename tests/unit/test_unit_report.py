"""How a distributed test reads in pytest's reports, on fake items: the command that
reproduces it, the phase durations moved from the ranks, the ranks' output and log sections,
and the failure's long representation."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.errors import RankError, WorldTimeout
from harness.plugin import item_state, report
from harness.protocol.failures import RankFailure
from harness.protocol.pytest_calls import LOG_MARK

ROOT = Path("/proj")
NODEID = "tests/test_x.py::test_a"


def _config(start: Path = ROOT, seed: object = None, randomly: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        invocation_params=SimpleNamespace(dir=start),
        rootpath=ROOT,
        getoption=lambda name, default=None: seed if name == "randomly_seed" else default,
        pluginmanager=SimpleNamespace(hasplugin=lambda name: randomly and name == "randomly"),
    )


class FakeItem:
    """What the report functions use of a test item."""

    def __init__(self, **config: Any) -> None:
        self.nodeid = NODEID
        self.config = _config(**config)
        self.location = ("tests/test_x.py", 11, "test_a")
        self.stash = pytest.Stash()
        self.sections: list[tuple[str, str, str]] = []

    def add_report_section(self, when: str, key: str, content: str) -> None:
        self.sections.append((when, key, content))


# ---------------------------------------------------------------- commands


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (ROOT, "pytest tests/test_x.py::test_a --dist-mptc"),
        (ROOT / "tests", "pytest test_x.py::test_a --dist-mptc"),
        (Path("/elsewhere"), "pytest ../proj/tests/test_x.py::test_a --dist-mptc"),
    ],
)
def test_a_command_is_for_the_directory_pytest_started_in(start: Path, expected: str) -> None:
    assert report.command(_config(start), [NODEID], "--dist-mptc") == expected


def test_a_command_quotes_ids_the_shell_would_split() -> None:
    ids = ["tests/test_x.py::test_a[ws2]", "tests/test_x.py::test_b[a b]"]
    assert report.command(_config(), ids, "--dist-backend=gloo") == (
        "pytest 'tests/test_x.py::test_a[ws2]' 'tests/test_x.py::test_b[a b]' --dist-backend=gloo"
    )


def test_a_command_keeps_pytest_randomlys_seed_and_order() -> None:
    config = _config(seed=1234, randomly=True)
    assert report.command(config, [NODEID], "--o") == (
        "pytest tests/test_x.py::test_a --o --randomly-seed=1234"
    )
    assert report.command(config, [NODEID, NODEID], "--o").endswith(
        "--o --randomly-seed=1234 --randomly-dont-reorganize"
    )


@pytest.mark.parametrize(("seed", "randomly"), [(1234, False), (None, True), ("last", True)])
def test_no_randomly_options_without_the_plugin_and_a_whole_seed(
    seed: object, randomly: bool
) -> None:
    command = report.command(_config(seed=seed, randomly=randomly), [NODEID, NODEID], "--o")
    assert "randomly" not in command


def test_a_repro_line_is_noted_per_test() -> None:
    item = FakeItem()
    assert report.repro(item) == ""
    report.set_repro(item, "confirmed on fresh processes; ", "2 ranks, gloo", "--dist-backend=gloo")
    assert report.repro(item) == (
        "confirmed on fresh processes; run (2 ranks, gloo): "
        "pytest tests/test_x.py::test_a --dist-backend=gloo"
    )
    assert report.repro(FakeItem()) == ""


# ---------------------------------------------------------------- phase durations


def _call(when: str, start: float, duration: float) -> SimpleNamespace:
    return SimpleNamespace(
        when=when, start=start, stop=start + duration, duration=duration, excinfo=None
    )


def _phases(item: FakeItem, durations: tuple[float, float, float]) -> list[SimpleNamespace]:
    """pytest's three phases as measured in the controller (the setup held the whole test),
    after the report hook moved the ranks' times."""
    calls, start = [], 100.0
    for when, duration in zip(("setup", "call", "teardown"), durations, strict=True):
        call = _call(when, start, duration)
        assert report.pytest_runtest_makereport(item, call) is None  # pytest's own report
        calls.append(call)
        start += duration
    return calls


def test_the_ranks_call_and_teardown_times_move_to_those_phases() -> None:
    item = FakeItem()
    report.keep_times(item, (1.0, 3.0, 2.0))
    setup, call, teardown = _phases(item, (10.0, 0.01, 0.01))
    assert (setup.start, setup.duration, setup.stop) == (100.0, 5.0, 105.0)
    assert (call.start, call.duration) == pytest.approx((105.0, 3.01))
    assert call.stop == pytest.approx(108.01)
    assert (teardown.start, teardown.duration) == pytest.approx((108.01, 2.01))
    # Their sum is what pytest measured.
    assert setup.duration + call.duration + teardown.duration == pytest.approx(10.02)
    assert item_state.of(item).moved is None  # forgotten after the teardown


@pytest.mark.parametrize(
    ("times", "moved"),
    [
        ((0.0, 3.0, 2.0), (3.0, 1.0)),  # the setup held 4 s: the teardown gets what is left
        ((0.0, 5.0, 2.0), (4.0, 0.0)),  # the call alone is more than it held
    ],
)
def test_no_phase_gets_more_than_the_setup_held(
    times: tuple[float, float, float], moved: tuple[float, float]
) -> None:
    item = FakeItem()
    report.keep_times(item, times)
    setup, call, teardown = _phases(item, (4.0, 0.0, 0.0))
    assert setup.duration == 0.0
    assert (call.duration, teardown.duration) == pytest.approx(moved)


def test_unknown_times_leave_the_phases_as_measured() -> None:
    item = FakeItem()
    report.keep_times(item, (1.0, 1.0, 1.0))
    report.keep_times(item, None)
    setup, call, _ = _phases(item, (4.0, 0.5, 0.0))
    assert (setup.duration, call.duration) == (4.0, 0.5)


# ---------------------------------------------------------------- output and log sections


def test_each_ranks_output_is_a_section_of_its_own_in_rank_order() -> None:
    item = FakeItem()
    report.add_output_sections(item, {1: ("out1", ""), 0: ("out0", "err0"), 2: ("", "")})
    assert item.sections == [
        ("call", "rank 0 stdout", "out0"),
        ("call", "rank 0 stderr", "err0"),
        ("call", "rank 1 stdout", "out1"),
    ]


def test_log_records_leave_stderr_for_each_phases_log_section() -> None:
    item = FakeItem()
    err0 = f"warning!\n{LOG_MARK}setup INFO fixture up\n{LOG_MARK}call INFO step 1\nmore"
    err1 = f"{LOG_MARK}call INFO step 1 on 1\n{LOG_MARK}teardown INFO down"
    report.add_output_sections(item, {0: ("", err0), 1: ("", err1)})
    assert item.sections == [
        ("call", "rank 0 stderr", "warning!\nmore"),
        ("setup", "log", "[rank 0] INFO fixture up"),
    ]
    # The others are added as their phase is reported.
    report.pytest_runtest_makereport(item, _call("call", 0.0, 1.0))
    assert item.sections[-1] == ("call", "log", "[rank 0] INFO step 1\n[rank 1] INFO step 1 on 1")
    report.pytest_runtest_makereport(item, _call("teardown", 1.0, 1.0))
    assert item.sections[-1] == ("teardown", "log", "[rank 1] INFO down")
    assert len(item.sections) == 4


def test_a_failed_setup_leaves_every_log_section_to_the_teardown() -> None:
    item = FakeItem()
    err = f"{LOG_MARK}call INFO a\n{LOG_MARK}teardown INFO b"
    report.add_output_sections(item, {0: ("", err)})
    report.pytest_runtest_makereport(item, _call("teardown", 0.0, 1.0))
    assert item.sections == [
        ("call", "log", "[rank 0] INFO a"),
        ("teardown", "log", "[rank 0] INFO b"),
    ]


# ---------------------------------------------------------------- a failure's report


def test_a_failure_reads_headline_root_cause_first_and_the_repro_last() -> None:
    error = RankError(
        "rank 1 raised ValueError: boom",
        {
            1: RankFailure(1, "ValueError", "boom", "Traceback\n  f()\nValueError: boom\n"),
            0: RankFailure(0, "RuntimeError", "peer", "RuntimeError: peer\n"),
        },
    )
    error.verdicts = ["collective #2 on the default group differs: ..."]
    item = FakeItem()
    report.set_repro(item, "", "2 ranks, gloo", "--dist-backend=gloo")
    text = str(report.DistributedFailureRepr(error, item))
    assert text.splitlines() == [
        "RankError: rank 1 raised ValueError: boom",
        "collective #2 on the default group differs: ...",
        "----------------------------- rank 1 (root cause) -----------------------------",
        "Traceback",
        "  f()",
        "ValueError: boom",
        "------------------------------------ rank 0 ------------------------------------",
        "RuntimeError: peer",
        "",
        "run (2 ranks, gloo): pytest tests/test_x.py::test_a --dist-backend=gloo",
    ]


def test_a_failure_points_pytests_one_line_summaries_at_the_test() -> None:
    error = WorldTimeout("the run did not finish within 5 s", timeout=5.0)
    error.hint = "raise the timeout"
    failure = report.DistributedFailureRepr(error, FakeItem())
    crash = failure.reprcrash
    assert (crash.path, crash.lineno) == ("/proj/tests/test_x.py", 12)
    assert str(crash) == "/proj/tests/test_x.py:12: WorldTimeout: the run did not finish within 5 s"
    assert str(failure).splitlines()[-2:] == ["", "raise the timeout"]


def test_a_failure_is_drawn_on_a_terminal_with_its_markup() -> None:
    error = RankError("rank 0 raised E: x", {0: RankFailure(0, "E", "x", "tb\nE: x\n")})
    drawn: list[tuple[str, ...]] = []
    writer = SimpleNamespace(
        sep=lambda fill, title: drawn.append(("sep", title)),
        line=lambda text, **markup: drawn.append(
            ("line", text, *sorted(k for k, v in markup.items() if v))
        ),
    )
    report.DistributedFailureRepr(error, FakeItem()).toterminal(writer)
    assert drawn == [
        ("line", "RankError: rank 0 raised E: x", "bold", "red"),
        ("sep", "rank 0"),
        ("line", "tb"),
        ("line", "E: x", "red"),  # a traceback's last line is its exception
    ]


# ---------------------------------------------------------------- warnings at the test


def test_the_harnesss_warnings_are_located_at_the_test_and_others_kept() -> None:
    harness_file = str(Path(report.__file__).parent / "session.py")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with report.warnings_at(FakeItem()):
            warnings.warn_explicit("leaked", ResourceWarning, harness_file, 5)
            warnings.warn_explicit("user's", UserWarning, "/proj/src/lib.py", 7)
    assert [(w.category, w.filename, w.lineno) for w in caught] == [
        (ResourceWarning, "/proj/tests/test_x.py", 12),
        (UserWarning, "/proj/src/lib.py", 7),
    ]


def test_a_skip_site_is_noted_and_forgotten() -> None:
    item = FakeItem()
    report.keep_skip_site(item, ("/proj/tests/test_x.py", 30))
    assert item_state.of(item).skip_site == ("/proj/tests/test_x.py", 30)
    report.keep_skip_site(item, None)
    assert item_state.of(item).skip_site is None
    report.keep_skip_site(item, None)  # forgetting twice is fine
