"""Same verdict as fresh processes: failures confirmed, order dependence named, --dist-verify.

The inner projects below depend on order the way real suites do: a library keeps a registry
in a module global, and registering a name twice raises. A test that registers after another
test registered on the same processes fails there and passes on fresh ones.
"""

from __future__ import annotations

import os

import pytest
from plugin_testutil import REGISTRY, TWO_RANKS, reports

# Each run of a test appends one line per rank to runs/<test>: how often it ran.
SUITE = """
import os

import pytest

import registry

RUNS = {runs!r}


def ran(test, rank):
    with open(os.path.join(RUNS, test), "a") as f:
        f.write(f"{{rank}}\\n")


@pytest.mark.distributed(world_size=2)
def test_first(rank):
    ran("test_first", rank)


@pytest.mark.distributed(world_size=2)
def test_registers(rank):
    ran("test_registers", rank)
    registry.register("relu")


@pytest.mark.distributed(world_size=2)
def test_innocent(rank):
    ran("test_innocent", rank)


@pytest.mark.distributed(world_size=2)
def test_registers_too(rank):
    ran("test_registers_too", rank)
    registry.register("relu")
"""


def _project(pytester: pytest.Pytester, suite: str = SUITE) -> str:
    runs = pytester.path / "runs"
    runs.mkdir()
    pytester.makepyfile(registry=REGISTRY, test_order=suite.format(runs=str(runs)))
    return str(runs)


def _runs(runs: str, test: str) -> int:
    """How many times ``test`` ran on some rank (its lines in the runs file, by rank 0)."""
    path = os.path.join(runs, test)
    if not os.path.exists(path):
        return 0
    with open(path) as handle:
        return handle.read().split().count("0")


def _failure(result: pytest.RunResult, test: str, when: str = "call") -> str:
    found = {name.rsplit("::", 1)[-1]: report for name, report in reports(result, when).items()}
    return str(found[test].longrepr)


def test_a_failure_after_another_test_names_it_and_passes_on_its_fresh_verdict(
    pytester: pytest.Pytester,
) -> None:
    runs = _project(pytester)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=4, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*test_order.py:*: OrderDependenceWarning: test_registers_too failed after "
            "test_registers on a reused world and passes on fresh processes (found in 3 runs); "
            "run: pytest test_order.py::test_registers test_order.py::test_registers_too "
            "--dist-backend=gloo",
        ]
    )
    # Reused, confirmed fresh, and in the bisection's runs: [registers, innocent, it] and
    # [innocent, it] (the tail halved), then [registers, it] (the culprit alone).
    assert _runs(runs, "test_registers_too") == 5
    assert _runs(runs, "test_registers") == 3
    assert _runs(runs, "test_first") == 1  # never needed again


def test_the_printed_command_reproduces_the_failure(pytester: pytest.Pytester) -> None:
    _project(pytester)
    result = pytester.runpytest(
        "-p",
        "no:randomly",
        "-o",
        "dist_confirm=off",
        "test_order.py::test_registers",
        "test_order.py::test_registers_too",
    )
    result.assert_outcomes(passed=1, failed=1)
    assert "'relu' is already registered" in _failure(result, "test_registers_too")


def test_dist_order_dependent_fail_fails_the_test_with_the_finding(
    pytester: pytest.Pytester,
) -> None:
    _project(pytester)
    result = pytester.runpytest("-p", "no:randomly", "-o", "dist_order_dependent=fail")
    result.assert_outcomes(passed=3, failed=1)
    failure = _failure(result, "test_registers_too")
    assert failure.startswith(
        "test_registers_too failed after test_registers on a reused world and passes on "
        "fresh processes (found in 3 runs); run: pytest test_order.py::test_registers "
        "test_order.py::test_registers_too --dist-backend=gloo"
    ), failure


def test_warnings_as_errors_make_an_order_dependence_the_tests_failure(
    pytester: pytest.Pytester,
) -> None:
    _project(pytester)
    result = pytester.runpytest("-p", "no:randomly", "-W", "error::harness.OrderDependenceWarning")
    result.assert_outcomes(passed=3, failed=1)  # a failure of the test, not a setup error
    failure = _failure(result, "test_registers_too")
    assert failure.startswith(
        "OrderDependenceWarning: test_registers_too failed after test_registers on a reused "
        "world and passes on fresh processes"
    ), failure


def test_a_failure_that_fresh_processes_confirm_is_reported_as_it_was(
    pytester: pytest.Pytester,
) -> None:
    runs = _project(
        pytester,
        SUITE
        + """

@pytest.mark.distributed(world_size=2)
def test_wrong(rank):
    ran("test_wrong", rank)
    assert rank == 1  # rank 0 fails: the root cause whichever rank ends first
""",
    )
    result = pytester.runpytest(
        "-p", "no:randomly", "test_order.py::test_first", "test_order.py::test_wrong"
    )
    result.assert_outcomes(passed=1, failed=1)
    failure = _failure(result, "test_wrong")
    assert failure.startswith("RankError: rank 0 raised AssertionError: assert 0 == 1"), failure
    assert failure.endswith(
        "confirmed on fresh processes; run (2 ranks, gloo): pytest "
        "test_order.py::test_wrong --dist-backend=gloo"
    ), failure
    assert "OrderDependenceWarning" not in result.stdout.str()
    assert _runs(runs, "test_wrong") == 2


def test_a_failure_fresh_processes_confirm_differently_is_reported_as_they_failed(
    pytester: pytest.Pytester,
) -> None:
    # On the reused ranks the test fails at its registration (test_registers ran there
    # first); on fresh ranks it gets past it and fails at its assertion. The report is the
    # fresh run's: what the test alone, or a native run, shows.
    _project(
        pytester,
        SUITE
        + """

@pytest.mark.distributed(world_size=2)
def test_registers_then_fails(rank):
    registry.register("relu")
    assert rank == 1, "fails on fresh processes too"
""",
    )
    result = pytester.runpytest(
        "-p",
        "no:randomly",
        "test_order.py::test_registers",
        "test_order.py::test_registers_then_fails",
    )
    result.assert_outcomes(passed=1, failed=1)
    failure = _failure(result, "test_registers_then_fails")
    assert failure.startswith(
        "RankError: rank 0 raised AssertionError: fails on fresh processes too"
    ), failure
    assert "already registered" not in failure, failure
    assert "confirmed on fresh processes; run (2 ranks, gloo)" in failure, failure
    assert "OrderDependenceWarning" not in result.stdout.str()


def test_a_failure_on_processes_that_were_fresh_anyway_runs_once(
    pytester: pytest.Pytester,
) -> None:
    runs = _project(
        pytester,
        SUITE
        + """

@pytest.mark.distributed(world_size=2)
def test_wrong_first(rank):
    ran("test_wrong_first", rank)
    assert rank == 5


@pytest.mark.distributed(world_size=2, isolate=True)
def test_wrong_isolated(rank):
    ran("test_wrong_isolated", rank)
    assert rank == 5
""",
    )
    result = pytester.runpytest(
        "-p",
        "no:randomly",
        "test_order.py::test_wrong_first",  # the first test of its world
        "test_order.py::test_first",
        "test_order.py::test_wrong_isolated",  # fresh processes of its own
    )
    result.assert_outcomes(passed=1, failed=2)
    for test in ("test_wrong_first", "test_wrong_isolated"):
        assert _runs(runs, test) == 1
        assert _failure(result, test).endswith(
            f"\nrun (2 ranks, gloo): pytest test_order.py::{test} --dist-backend=gloo"
        ), _failure(result, test)


def test_dist_confirm_off_reports_the_reused_failure(pytester: pytest.Pytester) -> None:
    runs = _project(pytester)
    result = pytester.runpytest("-p", "no:randomly", "-o", "dist_confirm=off")
    result.assert_outcomes(passed=3, failed=1)
    assert "'relu' is already registered" in _failure(result, "test_registers_too")
    assert _runs(runs, "test_registers_too") == 1


def test_the_search_stops_at_its_bound_and_names_the_candidates(
    pytester: pytest.Pytester,
) -> None:
    _project(pytester)
    result = pytester.runpytest("-p", "no:randomly", "-o", "dist_bisect_runs=1")
    result.assert_outcomes(passed=4, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*OrderDependenceWarning: test_registers_too failed on a reused world after 3 "
            "earlier tests and passes on fresh processes; no single earlier test found (the "
            "search used its 1 fresh world, ini dist_bisect_runs): the cause is among "
            "test_registers, test_innocent; run: pytest test_order.py::test_registers "
            "test_order.py::test_innocent test_order.py::test_registers_too --dist-backend=gloo",
        ]
    )
    result = pytester.runpytest("-p", "no:randomly", "-o", "dist_bisect_runs=0")
    result.stdout.fnmatch_lines(
        [
            "*OrderDependenceWarning: test_registers_too failed on a reused world after 3 "
            "earlier tests (test_first, test_registers, test_innocent) and passes on fresh "
            "processes; run: pytest test_order.py::test_first test_order.py::test_registers "
            "test_order.py::test_innocent test_order.py::test_registers_too --dist-backend=gloo",
        ]
    )


def test_an_earlier_test_that_fails_when_replayed_stops_the_search(
    pytester: pytest.Pytester,
) -> None:
    _project(
        pytester,
        """
import os

import pytest

import registry

RUNS = {runs!r}


@pytest.mark.distributed(world_size=2)
def test_once(rank):
    # Creates its file or fails: a second run of it fails.
    open(os.path.join(RUNS, f"once-{{rank}}"), "x").close()
    registry.register("relu")


@pytest.mark.distributed(world_size=2)
def test_registers_too(rank):
    registry.register("relu")
""",
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*OrderDependenceWarning: test_registers_too failed on a reused world after 1 "
            "earlier test and passes on fresh processes; no single earlier test found "
            "(test_once failed when it was run again on fresh processes): the cause is among "
            "test_once; run: pytest test_order.py::test_once test_order.py::test_registers_too "
            "--dist-backend=gloo",
        ]
    )


def test_a_confirmation_that_cannot_start_reports_the_failure_and_why(
    pytester: pytest.Pytester,
) -> None:
    _project(pytester)
    # The machine has no processes to spare once the session's world is up.
    pytester.makeconftest(
        """
        import harness.plugin.session as session

        class NoSecondWorld(session.World):
            started = 0

            def __init__(self, *args, **kwargs):
                if NoSecondWorld.started:
                    raise RuntimeError("no processes to spare")
                NoSecondWorld.started += 1
                super().__init__(*args, **kwargs)

        real, session.World = session.World, NoSecondWorld

        def pytest_unconfigure(config):
            session.World = real  # this run is in-process: the next must not see it
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=3, failed=1)
    failure = _failure(result, "test_registers_too")
    assert "'relu' is already registered" in failure
    assert failure.endswith(
        "not confirmed on fresh processes (no processes to spare); run (2 ranks, gloo): "
        "pytest test_order.py::test_registers_too --dist-backend=gloo"
    ), failure


VERIFY = """
import pytest

import registry


@pytest.mark.distributed(world_size=2)
def test_setup_registry(rank):
    registry.register("relu")


@pytest.mark.distributed(world_size=2)
def test_relu_is_registered(rank):
    # Passes only where test_setup_registry ran before it on the same processes.
    assert "relu" in registry._registered


@pytest.mark.distributed(world_size=2)
def test_independent(rank):
    assert rank in (0, 1)
"""


def test_dist_verify_finds_a_test_that_passes_only_after_another(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(registry=REGISTRY, test_verify=VERIFY)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=3)  # reuse hides it
    result = pytester.runpytest("-p", "no:randomly", "--dist-verify")
    result.assert_outcomes(passed=2, failed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "harness: --dist-verify: each distributed test that ran on a reused world after "
            "others runs again on fresh processes",
            "*OrderDependenceWarning: test_relu_is_registered passed after "
            "test_setup_registry on a reused world and fails on fresh processes (found in 1 "
            "run); run: pytest test_verify.py::test_setup_registry "
            "test_verify.py::test_relu_is_registered --dist-backend=gloo",
            "harness --dist-verify: 2 tests also run on fresh processes, 1 differ (each reported "
            "as an order dependence)",
        ]
    )
    failure = _failure(result, "test_relu_is_registered")
    assert "assert 'relu' in set()" in failure, failure


def test_dist_verify_under_xdist(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(registry=REGISTRY, test_verify=VERIFY)
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-n", "2", "--dist", "loadfile", "--dist-verify"
    )
    result.assert_outcomes(passed=2, failed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*OrderDependenceWarning: test_relu_is_registered passed after test_setup_registry*",
            "harness --dist-verify: 2 tests also run on fresh processes, 1 differ (each reported "
            "as an order dependence)",
        ]
    )


@pytest.mark.usefixtures("torch_test_modules")
def test_an_order_dependence_under_dist_mptc(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        registry=REGISTRY,
        test_cases=TWO_RANKS
        + """
import registry


class TestOrder(TwoRanks):
    def test_1_registers(self):
        registry.register("relu")

    def test_2_registers_too(self):
        registry.register("relu")
""",
    )
    result = pytester.runpytest("-p", "no:randomly", "--dist-mptc")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*OrderDependenceWarning: TestOrder::test_2_registers_too failed after "
            "TestOrder::test_1_registers on a reused world and passes on fresh processes "
            "(found in 1 run); run: pytest test_cases.py::TestOrder::test_1_registers "
            "test_cases.py::TestOrder::test_2_registers_too --dist-mptc",
        ]
    )


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("dist_confirm=maybe", "unknown ini option dist_confirm 'maybe'; valid: 'fresh', 'off'"),
        (
            "dist_order_dependent=raise",
            "unknown ini option dist_order_dependent 'raise'; valid: 'warn', 'fail'",
        ),
        ("dist_bisect_runs=-1", "ini option dist_bisect_runs must be a whole number >= 0*"),
    ],
)
def test_a_bad_setting_is_a_usage_error_naming_it(
    pytester: pytest.Pytester, option: str, message: str
) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("-o", option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])
