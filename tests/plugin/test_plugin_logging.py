"""Log records of a distributed test: in pytest's ``Captured log`` sections, per phase.

Records logged inside the ranks are what pytest's own log capture would take in-process (its
``log_level``, else the loggers' levels), formatted with its ``log_format``, each line
prefixed with the rank; not in the rank's stderr section. A rank-side ``caplog`` honours
``log_level`` too.
"""

from __future__ import annotations

import pytest
from plugin_testutil import reports

LOGGING = """
import logging
import os
import harness
import pytest

log = logging.getLogger("lib")

@harness.fixture
def noisy(rank):
    log.warning("setting up on %d", rank)
    yield
    log.warning("tearing down on %d", rank)

@pytest.mark.distributed(world_size=2)
def test_logs(rank, noisy):
    log.warning("warned by %d", rank)
    log.info("informed by %d", rank)
    assert rank == 0
"""


def sections(report: pytest.TestReport) -> dict[str, str]:
    return dict(report.sections)


def test_rank_records_are_captured_logs_of_their_phase_with_the_rank(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_logging=LOGGING)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=1)
    found = sections(reports(result, "teardown")["test_logs"])
    assert found["Captured log setup"].splitlines() == [
        f"[rank {rank}] WARNING  lib:test_logging.py:10 setting up on {rank}" for rank in (0, 1)
    ]
    assert found["Captured log call"].splitlines() == [
        f"[rank {rank}] WARNING  lib:test_logging.py:16 warned by {rank}" for rank in (0, 1)
    ]
    assert found["Captured log teardown"].splitlines() == [
        f"[rank {rank}] WARNING  lib:test_logging.py:12 tearing down on {rank}" for rank in (0, 1)
    ]
    # The records are in no stderr section, and the failure shows them.
    assert not any("stderr" in title for title in found)
    result.stdout.fnmatch_lines(["*Captured log call*", "[[]rank 1[]] WARNING  lib:*warned by 1"])


def test_log_level_and_log_format_apply_in_the_ranks(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        """
        [pytest]
        log_format = %(name)s|%(levelname)s|%(message)s
        """
    )
    pytester.makepyfile(test_logging=LOGGING)
    result = pytester.runpytest("-p", "no:randomly", "--log-level=INFO")
    result.assert_outcomes(failed=1)
    text = sections(reports(result)["test_logs"])["Captured log call"]
    assert text.splitlines() == [
        "[rank 0] lib|WARNING|warned by 0",
        "[rank 0] lib|INFO|informed by 0",
        "[rank 1] lib|WARNING|warned by 1",
        "[rank 1] lib|INFO|informed by 1",
    ]


def test_each_test_on_the_same_ranks_captures_its_own_records(
    pytester: pytest.Pytester,
) -> None:
    # The ranks keep one log handler between tests: each test's records, and only its own.
    pytester.makepyfile(
        test_twice="""
        import logging
        import pytest

        @pytest.mark.distributed(world_size=2)
        @pytest.mark.parametrize("i", [1, 2, 3])
        def test_log(rank, i):
            logging.getLogger("lib").warning("test %d on %d", i, rank)
            assert i != 2
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    for i in (1, 2, 3):
        text = sections(reports(result)[f"test_log[{i}]"])["Captured log call"]
        assert text.splitlines() == [
            f"[rank {rank}] WARNING  lib:test_twice.py:7 test {i} on {rank}" for rank in (0, 1)
        ]


def test_records_of_a_rank_that_crashes_are_kept(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_crash="""
        import logging
        import os
        import pytest

        @pytest.mark.distributed(world_size=2)
        def test_crash(rank):
            logging.getLogger("lib").error("about to exit on %d", rank)
            if rank == 1:
                os._exit(3)
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=1)
    text = sections(reports(result)["test_crash"])["Captured log call"]
    assert "[rank 1] ERROR    lib:test_crash.py:7 about to exit on 1" in text.splitlines()


def test_rank_side_caplog_honours_the_log_level_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        """
        [pytest]
        log_level = INFO
        log_format = %(levelname)s %(message)s
        """
    )
    pytester.makepyfile(
        """
        import logging
        import pytest

        @pytest.mark.distributed(world_size=2)
        def test_caplog(rank, caplog):
            logging.getLogger("lib").info("hello from %d", rank)
            logging.getLogger("lib").debug("not at INFO")
            assert caplog.messages == [f"hello from {rank}"]
            assert caplog.text == f"INFO hello from {rank}\\n"
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1)


def test_under_s_rank_records_reach_the_terminal_prefixed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_logging=LOGGING)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-s")
    result.assert_outcomes(failed=1)
    output = result.stdout.str() + result.stderr.str()
    assert "[rank 1] WARNING  lib:test_logging.py:16 warned by 1" in output.splitlines()
    assert "harness-log" not in output


def test_without_pytest_logging_rank_records_stay_in_the_rank_stderr(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_logging=LOGGING)
    result = pytester.runpytest("-p", "no:randomly", "-p", "no:logging")
    result.assert_outcomes(failed=1)
    found = sections(reports(result)["test_logs"])
    assert not any("Captured log" in title for title in found)
    assert "warned by 1" in found["Captured rank 1 stderr call"]
