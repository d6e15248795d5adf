"""The plugin's settings and its marker, on fake configs and items: which place wins
(marker > command line > ini > default), and what a bad value says."""

from __future__ import annotations

import zlib
from types import SimpleNamespace
from typing import Any

import pytest

from harness import faults
from harness.plugin import item_settings, marker, settings
from harness.plugin.marker import BACKEND_PARAM, FAULT_PARAM, WORLD_SIZE_PARAM, MarkSpec
from harness.plugin.settings import Settings
from harness.protocol.messages import OUTPUT_CAPTURE, OUTPUT_PREFIX, CallOptions

# ---------------------------------------------------------------- fakes


class FakeConfig:
    """A pytest config as the settings read it: options by dest, ini values as text."""

    def __init__(
        self, options: dict[str, Any] | None = None, *, randomly: bool = False, **ini: Any
    ) -> None:
        self.options = options or {}
        self.ini = {"markers": [], **ini}
        self.stash = pytest.Stash()
        self.pluginmanager = SimpleNamespace(hasplugin=lambda name: randomly and name == "randomly")

    def getoption(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)

    def getini(self, name: str) -> Any:
        return self.ini.get(name, False if name == "dist_mptc" else "")


class FakeItem:
    """A test item with markers (closest first) and, when parametrized, its parameters."""

    def __init__(
        self,
        *marks: pytest.Mark,
        params: dict[str, Any] | None = None,
        config: FakeConfig | None = None,
    ) -> None:
        self.config = config or FakeConfig()
        marker.claim_marker(self.config)
        self.marks = list(marks)
        self.stash = pytest.Stash()
        self.nodeid = "tests/test_x.py::test_a"
        self.looked_up = 0
        if params is not None:
            self.callspec = SimpleNamespace(params=params)

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        self.looked_up += 1
        return next((m for m in self.marks if m.name == name), None)


def _mark(*args: Any, **kwargs: Any) -> pytest.Mark:
    return pytest.mark.distributed(*args, **kwargs).mark


def _other(name: str, *args: Any, **kwargs: Any) -> Any:
    """A marker of another name, as much of it as the plugin reads (such a name is not
    declared here: ``pytest.mark`` would refuse it under ``--strict-markers``)."""
    return SimpleNamespace(name=name, args=args, kwargs=kwargs)


def _test(*args: Any, session: Settings | None = None, **kwargs: Any) -> Any:
    return item_settings.for_test(session or Settings(), FakeItem(_mark(*args, **kwargs)))


def _fails(*args: Any, **kwargs: Any) -> str:
    with pytest.raises(pytest.fail.Exception) as info:
        _test(*args, **kwargs)
    assert not info.value.pytrace
    return info.value.msg


def _usage_error(config: FakeConfig) -> str:
    with pytest.raises(pytest.UsageError) as info:
        settings.read(config)
    return str(info.value)


# ---------------------------------------------------------------- the session's settings


def test_the_defaults() -> None:
    found = settings.read(FakeConfig())
    expected = Settings()
    for name in (
        "backend",
        "timeout",
        "isolate",
        "check_collectives",
        "leaks",
        "mptc",
        "confirm",
        "order_dependent",
        "bisect_runs",
        "verify",
    ):
        assert getattr(found, name) == getattr(expected, name), name
    assert (found.timeout, found.bisect_runs, found.confirm) == (120.0, 8, True)
    assert (found.memory_growth, found.max_rank_memory) == (64 * 2**20, None)


def test_the_command_line_wins_over_the_ini_file() -> None:
    config = FakeConfig({"dist_timeout": 30.0}, dist_timeout="60")
    assert settings.read(config).timeout == 30.0
    assert settings.read(FakeConfig(dist_timeout=" 60 ")).timeout == 60.0


def test_each_ini_option_is_read() -> None:
    config = FakeConfig(
        dist_leaks="ERROR",
        dist_confirm="off",
        dist_order_dependent="fail",
        dist_bisect_runs=" 3 ",
        dist_mptc=True,
    )
    found = settings.read(config)
    assert (found.leaks, found.confirm, found.order_dependent) == ("error", False, "fail")
    assert (found.bisect_runs, found.mptc) == (3, True)
    assert settings.read(FakeConfig(dist_bisect_runs="0")).bisect_runs == 0


def test_each_flag_is_read() -> None:
    options = {
        "dist_backend": "gloo",
        "dist_isolate": True,
        "dist_no_collective_check": True,
        "dist_mptc": True,
        "dist_verify": True,
    }
    found = settings.read(FakeConfig(options))
    assert found.backend == "gloo"
    assert (found.isolate, found.mptc, found.verify) == (True, True, True)
    assert not found.check_collectives


@pytest.mark.parametrize(
    ("options", "ini", "limit"),
    [
        ({}, {"dist_max_rank_memory": " 2GiB "}, 2 * 2**30),
        ({}, {"dist_max_rank_memory": "2GB"}, 2 * 10**9),
        ({"dist_max_rank_memory": "512MiB"}, {"dist_max_rank_memory": "2GiB"}, 512 * 2**20),
        ({"dist_max_rank_memory": "1234567"}, {}, 1234567),
    ],
)
def test_the_memory_limit_is_a_size_from_the_command_line_else_the_ini_file(
    options: dict[str, Any], ini: dict[str, Any], limit: int
) -> None:
    assert settings.read(FakeConfig(options, **ini)).max_rank_memory == limit


def test_the_memory_growth_threshold_is_read_from_the_ini_file() -> None:
    assert settings.read(FakeConfig(dist_memory_growth="16MiB")).memory_growth == 16 * 2**20
    assert settings.read(FakeConfig(dist_memory_growth="0")).memory_growth == 0


def test_the_desync_check_is_on_unless_the_flag_or_the_ini_says_off() -> None:
    assert settings.read(FakeConfig()).check_collectives
    assert not settings.read(FakeConfig(dist_no_collective_check=True)).check_collectives


@pytest.mark.parametrize(
    ("capture", "output"), [("fd", OUTPUT_CAPTURE), ("sys", OUTPUT_CAPTURE), ("no", OUTPUT_PREFIX)]
)
def test_the_ranks_output_is_captured_unless_pytests_is_not(capture: str, output: str) -> None:
    assert settings.read(FakeConfig({"capture": capture})).output == output
    assert settings.read(FakeConfig()).output == OUTPUT_CAPTURE


@pytest.mark.parametrize(
    ("seed", "randomly", "found"),
    [(99, True, 99), (99, False, None), ("99", True, None), (None, True, None)],
)
def test_pytest_randomlys_seed_counts_only_as_a_whole_number_with_the_plugin(
    seed: object, randomly: bool, found: object
) -> None:
    config = FakeConfig({"randomly_seed": seed}, randomly=randomly)
    assert settings.randomly_seed(config) == found
    assert settings.read(config).randomly_seed == found


def test_the_settings_are_read_once_per_session() -> None:
    config = FakeConfig(dist_timeout="60")
    first = settings.read(config)
    config.ini["dist_timeout"] = "nonsense"
    assert settings.read(config) is first


@pytest.mark.parametrize(
    ("options", "ini", "message"),
    [
        (
            {"dist_timeout": -5.0},
            {},
            "--dist-timeout must be a positive number of seconds, got -5.0",
        ),
        ({}, {"dist_timeout": "soon"}, "ini option dist_timeout must be a positive number of "),
        ({}, {"dist_timeout": "inf"}, "got 'inf'"),
        (
            {},
            {"dist_leaks": "loud"},
            "unknown ini option dist_leaks 'loud'; valid: 'warn', 'error', 'off'",
        ),
        (
            {},
            {"dist_confirm": "yes"},
            "unknown ini option dist_confirm 'yes'; valid: 'fresh', 'off'",
        ),
        (
            {},
            {"dist_order_dependent": "ignore"},
            "unknown ini option dist_order_dependent 'ignore'; valid: 'warn', 'fail'",
        ),
        ({}, {"dist_bisect_runs": "-1"}, "dist_bisect_runs must be a whole number >= 0"),
        ({}, {"dist_bisect_runs": "2.5"}, "got '2.5'"),
        (
            {"dist_max_rank_memory": "lots"},
            {},
            "--dist-max-rank-memory must be a size: bytes (an int), or a number and a unit "
            "such as 2GiB, 512MiB, 2GB, got 'lots'",
        ),
        ({}, {"dist_max_rank_memory": "2 parsecs"}, "ini option dist_max_rank_memory must be"),
        ({}, {"dist_memory_growth": "-1"}, "ini option dist_memory_growth must be a size"),
    ],
)
def test_a_bad_session_value_is_a_usage_error_naming_it(
    options: dict[str, Any], ini: dict[str, Any], message: str
) -> None:
    assert message in _usage_error(FakeConfig(options, **ini))


# ---------------------------------------------------------------- one test's settings


def test_a_marker_without_arguments_takes_the_sessions_settings() -> None:
    session = Settings(timeout=45.0, backend="gloo")
    test = _test(session=session)
    assert (test.world_size, test.backend, test.isolate, test.init) == (2, "gloo", False, True)
    assert (test.call.timeout, test.call.check_collectives, test.call.faults) == (
        45.0,
        True,
        (),
    )


def test_a_tests_call_is_named_after_it_and_seeded_from_its_id() -> None:
    first = _test().call
    assert first.name == "test tests/test_x.py::test_a"
    assert first.seed == zlib.crc32(b"tests/test_x.py::test_a")
    other = FakeItem(_mark())
    other.nodeid = "tests/test_x.py::test_b"
    assert item_settings.for_test(Settings(), other).call.seed != first.seed
    assert _test().call == first  # the same numbers, whatever ran before


def test_pytest_randomlys_seed_seeds_every_test_alike() -> None:
    assert _test(session=Settings(randomly_seed=7)).call.seed == 7
    assert _test(session=Settings(randomly_seed=0)).call.seed == 0


def test_a_tests_call_takes_the_sessions_output_and_its_timeout_property() -> None:
    test = _test(timeout=2.5, session=Settings(output=OUTPUT_PREFIX))
    assert test.call == CallOptions(
        timeout=2.5,
        output=OUTPUT_PREFIX,
        seed=test.call.seed,
        name="test tests/test_x.py::test_a",
        check_collectives=True,
        faults=(),
    )
    assert test.timeout == 2.5


def test_the_marker_wins_over_the_session() -> None:
    session = Settings(timeout=45.0, backend="gloo")
    test = _test(4, backend="nccl", timeout=5, session=session)
    assert (test.world_size, test.backend, test.call.timeout) == (4, "nccl", 5.0)


@pytest.mark.parametrize(
    ("asked", "session", "resolved"),
    [
        ("auto", "gloo", "gloo"),
        ("AUTO", "nccl", "nccl"),
        ("auto", "auto", "auto"),
        ("Gloo", "nccl", "gloo"),
    ],
)
def test_a_markers_auto_backend_is_the_command_lines(
    asked: str, session: str, resolved: str
) -> None:
    assert _test(backend=asked, session=Settings(backend=session)).backend == resolved


def test_flags_of_the_session_only_add_to_the_markers() -> None:
    isolated = Settings(isolate=True, check_collectives=False)
    test = _test(isolate=False, check_collectives=True, session=isolated)
    assert test.isolate
    assert not test.call.check_collectives
    assert _test(isolate=True).isolate
    assert not _test(check_collectives=False).call.check_collectives


def test_traces_are_kept_under_trace_all_or_with_faults_and_only_with_a_trace_dir() -> None:
    kill = faults.kill(1, 1)
    assert not _test().call.keep_traces
    assert not _test(faults=[kill]).call.keep_traces  # no --dist-trace-dir
    traced = Settings(trace_dir="traces")
    assert not _test(session=traced).call.keep_traces  # a passing test's folder: never asked
    assert _test(faults=[kill], session=traced).call.keep_traces  # a fired fault writes one
    every = Settings(trace_dir="traces", trace_all=True)
    assert _test(session=every).call.keep_traces
    assert not _test(session=Settings(trace_all=True)).call.keep_traces


def test_a_parametrized_case_takes_its_world_size_backend_and_fault() -> None:
    fault = faults.kill(3, 1)
    sweep = faults.sweep("kill", ranks=[0, 3], at=[1])
    item = FakeItem(
        _mark([2, 4], backend=["gloo", "auto"], faults=sweep),
        params={WORLD_SIZE_PARAM: 4, BACKEND_PARAM: "auto", FAULT_PARAM: fault},
    )
    test = item_settings.for_test(Settings(backend="nccl"), item)
    assert (test.world_size, test.backend, test.call.faults) == (4, "nccl", (fault,))


def test_the_closest_marker_is_used_and_looked_up_once() -> None:
    item = FakeItem(_mark(3), _mark(2, timeout=9))
    first = item_settings.for_test(Settings(), item)
    again = item_settings.for_test(Settings(), item)
    assert first.world_size == again.world_size == 3
    assert item.looked_up == 1


def test_a_marker_under_another_name_is_the_plugins() -> None:
    config = FakeConfig(dist_marker="multi")
    item = FakeItem(_mark(4), _other("multi", 3, init="no"), config=config)
    with pytest.raises(pytest.fail.Exception) as info:
        item_settings.for_test(Settings(), item)
    assert info.value.msg == "invalid @pytest.mark.multi: init must be True or False, not 'no'"


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0,), {}, "world_size must be >= 1, got 0"),
        (("2",), {}, "world_size must be an int >= 1, not '2'"),
        (([],), {}, "world_size must be an int >= 1 or a non-empty list of them, not []"),
        ((), {"backend": "tcp"}, "unknown backend 'tcp'; valid: 'auto', 'gloo', 'nccl'"),
        ((), {"timeout": 0}, "timeout must be a positive number of seconds or None, got 0"),
        ((), {"timeout": "30"}, "timeout must be a positive number of seconds or None, got '30'"),
        ((), {"init": 1}, "init must be True or False, not 1"),
        ((), {"check_collectives": "off"}, "check_collectives must be True or False, not 'off'"),
        ((2,), {"faults": [faults.kill(2, 1)]}, "rank 2 is not in a world of 2"),
        (
            (),
            {"faults": faults.kill(0, 1)},
            "faults must be a list of faults made by harness.faults",
        ),
        (
            (),
            {"faults": faults.sweep("kill", ranks=[0], at=[1])},
            "faults: a sweep of faults is meant one fault at a time",
        ),
        ((), {"timout": 3}, "unknown argument(s) 'timout' (did you mean 'timeout'?)"),
        ((2, 3), {}, "world_size is the only positional argument, got 2: (2, 3)"),
    ],
)
def test_a_bad_marker_fails_the_test_naming_the_value(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    text = _fails(*args, **kwargs)
    assert text.startswith("invalid @pytest.mark.distributed: ")
    assert message in text


# ---------------------------------------------------------------- the marker's arguments


def test_parse_mark_reads_world_size_by_position_or_name() -> None:
    assert marker.parse_mark(_mark()) == MarkSpec()
    assert marker.parse_mark(_mark(4)).world_size == 4
    assert marker.parse_mark(_mark(world_size=[2, 4])).world_size == [2, 4]
    spec = marker.parse_mark(_mark(3, backend="gloo", isolate=True, faults=()))
    assert (spec.world_size, spec.backend, spec.isolate) == (3, "gloo", True)


@pytest.mark.parametrize(
    ("mark", "message"),
    [
        (_mark(2, world_size=3), "world_size given twice (positionally and by name)"),
        (_mark(2, 4), "world_size is the only positional argument, got 2: (2, 4)"),
        (
            _mark(bakend="gloo"),
            "unknown argument(s) 'bakend' (did you mean 'backend'?); valid: world_size, "
            "backend, timeout, isolate, init, check_collectives, faults, gpus_per_rank, "
            "ranks_per_gpu, restarts",
        ),
        (_mark(size=2), "unknown argument(s) 'size'; valid: world_size, "),
        (
            _mark(zzz=1, isolated=True, fault=[]),
            "unknown argument(s) 'fault', 'isolated', 'zzz' (did you mean 'faults'?) "
            "(did you mean 'isolate'?); valid: ",
        ),
    ],
)
def test_parse_mark_rejects_unknown_and_surplus_arguments(mark: pytest.Mark, message: str) -> None:
    with pytest.raises(ValueError) as info:
        marker.parse_mark(mark)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("dist_marker", "markers", "chosen"),
    [
        ("", [], "distributed"),
        ("", ["slow: a slow test", "distributedx: other"], "distributed"),
        ("", ["distributed: our own"], None),
        ("", ["distributed(n): our own, with arguments"], None),
        ("", [" distributed : spaced"], None),
        ("multi", ["distributed: our own"], "multi"),
    ],
)
def test_which_marker_is_the_plugins(dist_marker: str, markers: list[str], chosen: str) -> None:
    assert marker.choose_marker(dist_marker, markers) == chosen


def test_claiming_the_marker_notes_it_for_the_session() -> None:
    config = FakeConfig(dist_marker=" multi ")
    assert marker.marker_name(config) is None
    assert marker.claim_marker(config) == "multi"
    assert marker.marker_name(config) == "multi"
    with pytest.raises(
        pytest.UsageError, match=r"must be a marker name \(an identifier\), got 'a-b'"
    ):
        marker.claim_marker(FakeConfig(dist_marker="a-b"))


def test_a_test_without_the_plugins_marker_has_none() -> None:
    item = FakeItem(_other("slow"))
    assert marker.find_mark(item) is None
    own = FakeItem(_mark(2), config=FakeConfig(markers=["distributed: ours"]))
    assert marker.find_mark(own) is None  # the project's own marker: not the plugin's


@pytest.mark.parametrize(
    ("env", "found"),
    [
        ({"RANK": "1", "WORLD_SIZE": "4"}, (1, 4)),
        ({"RANK": "1"}, None),
        ({"RANK": "x", "WORLD_SIZE": "4"}, None),
        ({}, None),
    ],
)
def test_a_launchers_world_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], found: tuple[int, int] | None
) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert marker.launcher_world() == found


class FakeMetafunc:
    """What ``marker.parametrize`` uses of a ``pytest.Metafunc``."""

    def __init__(self, mark: pytest.Mark) -> None:
        self.definition = FakeItem(mark)
        self.function = lambda: None  # no @given test
        self.fixturenames = ["request"]
        self.calls: list[tuple[str, list[Any], list[str]]] = []

    def parametrize(self, name: str, values: list[Any], ids: list[str]) -> None:
        self.calls.append((name, values, ids))


def _parametrized(mark: pytest.Mark) -> FakeMetafunc:
    metafunc = FakeMetafunc(mark)
    marker.parametrize(metafunc)  # type: ignore[arg-type]
    return metafunc


def test_lists_and_sweeps_become_parameters_with_readable_ids() -> None:
    sweep = faults.sweep("kill", ranks=[0, 1], at=[2], when="during")
    metafunc = _parametrized(_mark([2, 4], backend=("gloo", "nccl"), faults=sweep))
    assert metafunc.calls == [
        (WORLD_SIZE_PARAM, [2, 4], ["ws2", "ws4"]),
        (BACKEND_PARAM, ["gloo", "nccl"], ["gloo", "nccl"]),
        (FAULT_PARAM, list(sweep), ["kill-during-r0-at2", "kill-during-r1-at2"]),
    ]
    assert metafunc.fixturenames == ["request", WORLD_SIZE_PARAM, BACKEND_PARAM, FAULT_PARAM]


@pytest.mark.parametrize(
    "mark",
    [
        _mark(2, backend="gloo", faults=[faults.kill(0, 1)]),  # single values, a plain list
        _mark([]),  # reported when the test runs
        _mark(typo=1),
    ],
)
def test_single_values_and_bad_markers_are_not_parametrized(mark: pytest.Mark) -> None:
    assert _parametrized(mark).calls == []


def test_a_test_without_the_marker_is_not_parametrized() -> None:
    assert _parametrized(_other("slow")).calls == []


class _TraceConfig(FakeConfig):
    """A config started from ``base``, its ini file there too."""

    def __init__(self, base: Any, options: dict[str, Any] | None = None, **ini: Any) -> None:
        super().__init__(options, **ini)
        self.invocation_params = SimpleNamespace(dir=base / "cwd")
        self.inipath = base / "pytest.ini"
        self.rootpath = base


def test_the_trace_dir_option_wins_over_the_ini_and_is_made(tmp_path: Any) -> None:
    config = _TraceConfig(tmp_path, {"dist_trace_dir": "cli"}, dist_trace_dir="ini")
    found = settings.read(config)
    assert found.trace_dir == str(tmp_path / "cwd" / "cli")
    assert (tmp_path / "cwd" / "cli").is_dir()
    assert not found.trace_all
    assert settings.read(_TraceConfig(tmp_path)).trace_dir == ""


def test_the_ini_trace_dir_is_relative_to_the_ini_file(tmp_path: Any) -> None:
    config = _TraceConfig(tmp_path, {"dist_trace_all": True}, dist_trace_dir="traces")
    found = settings.read(config)
    assert found.trace_dir == str(tmp_path / "traces")
    assert found.trace_all


def test_trace_all_needs_a_trace_dir(tmp_path: Any) -> None:
    found = _usage_error(_TraceConfig(tmp_path, {"dist_trace_all": True}))
    assert found == (
        "--dist-trace-all writes each test's trace folder into --dist-trace-dir (or ini "
        "dist_trace_dir): give one too"
    )


def test_an_unwritable_trace_dir_is_a_usage_error_naming_it(tmp_path: Any) -> None:
    (tmp_path / "a-file").write_text("")
    found = _usage_error(_TraceConfig(tmp_path, dist_trace_dir="a-file/traces"))
    assert found.startswith(f"ini dist_trace_dir '{tmp_path / 'a-file' / 'traces'}' cannot be used")


# ---------------------------------------------------------------- schedules


def test_schedules_are_the_markers_then_the_command_lines_then_the_ini_files() -> None:
    assert _test().schedules == ()
    assert _test(schedules=3).schedules == (1, 2, 3)
    session = settings.read(FakeConfig({"dist_schedules": "5"}, dist_schedules="7"))
    assert session.schedules == 5
    assert settings.read(FakeConfig(dist_schedules=" 7 ")).schedules == 7
    assert _test(session=session).schedules == (1, 2, 3, 4, 5)
    assert _test(schedules=2, session=session).schedules == (1, 2)
    # schedules=0 opts a test out of the session's schedules, and of its seed.
    seeded = settings.read(FakeConfig({"dist_schedules": "5", "dist_schedule_seed": "9"}))
    assert _test(schedules=0, session=seeded).schedules == ()


def test_a_seed_runs_its_schedule_alone() -> None:
    session = settings.read(FakeConfig({"dist_schedule_seed": "9"}))
    assert session.schedule_seed == 9
    assert _test(session=session).schedules == (9,)
    assert _test(schedules=50, session=session).schedules == (9,)
    assert _test(schedules=50, schedule_seed=4, session=session).schedules == (4,)


def test_the_longest_hold_is_the_markers_then_the_command_lines_then_the_ini_files() -> None:
    assert _test().schedule_delay == 1.0
    config = FakeConfig({"dist_schedule_delay": "0.5"}, dist_schedule_delay="2")
    session = settings.read(config)
    assert session.schedule_delay == 0.5
    assert settings.read(FakeConfig(dist_schedule_delay="2")).schedule_delay == 2.0
    assert _test(schedule_delay=3, session=session).schedule_delay == 3.0


def test_a_sweeps_clean_run_and_a_test_with_restarts_run_no_schedule() -> None:
    session = settings.read(FakeConfig({"dist_schedules": "5"}))
    item = FakeItem(_mark(), params={FAULT_PARAM: marker.CleanRun(1)})
    assert item_settings.for_test(session, item).schedules == ()
    assert _test(restarts=1, session=session).schedules == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedules": -1}, "schedules must be >= 0, got -1"),
        ({"schedules": "many"}, "schedules must be an int >= 0, not 'many'"),
        ({"schedules": 2.5}, "schedules must be an int >= 0, not 2.5"),
        ({"schedule_seed": "7"}, "schedule_seed must be an int >= 0 (a seed), not '7'"),
        ({"schedule_seed": -2}, "schedule_seed must be an int >= 0 (a seed), got -2"),
        ({"schedule_delay": 0}, "schedule_delay must be a positive number of seconds, got 0"),
        ({"schedule_delay": "1s"}, "got '1s'"),
        ({"schedules": 3, "restarts": 1}, "schedules and restarts do not combine"),
    ],
)
def test_a_bad_schedule_argument_fails_the_test_naming_it(
    kwargs: dict[str, Any], message: str
) -> None:
    assert message in _fails(**kwargs)


@pytest.mark.parametrize(
    ("options", "ini", "message"),
    [
        ({"dist_schedules": "lots"}, {}, "--dist-schedules must be an int >= 0, not 'lots'"),
        ({}, {"dist_schedules": "-3"}, "ini dist_schedules must be >= 0, got -3"),
        (
            {"dist_schedule_seed": "x"},
            {},
            "--dist-schedule-seed must be an int >= 0 (a seed), not 'x'",
        ),
        (
            {"dist_schedule_delay": "-1"},
            {},
            "--dist-schedule-delay must be a positive number of seconds, got '-1'",
        ),
        ({}, {"dist_schedule_delay": "nan"}, "ini dist_schedule_delay must be a positive"),
    ],
)
def test_a_bad_schedule_option_is_a_usage_error_naming_it(
    options: dict[str, Any], ini: dict[str, Any], message: str
) -> None:
    assert message in _usage_error(FakeConfig(options, **ini))
