"""Each phase of a distributed test takes the time the ranks spent in it.

The ranks run a test's setup, body and teardown in one round trip, during pytest's setup
phase; the time they measured for the body and the teardown is reported under ``call`` and
``teardown`` (``--durations``, JUnit XML), as for a test run in-process. Judged by lower
bounds that sleeps guarantee on any machine, never by an upper bound on wall time.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from plugin_testutil import reports

BODY_S = 1.0
SETUP_S = 0.6
TEARDOWN_S = 0.3


def phases(result: pytest.RunResult, name: str) -> dict[str, pytest.TestReport]:
    return {when: reports(result, when)[name] for when in ("setup", "call", "teardown")}


def assert_in_order(found: dict[str, pytest.TestReport]) -> None:
    """Each phase ends before the next starts (their start and stop moved with the time)."""
    setup, call, teardown = found["setup"], found["call"], found["teardown"]
    assert setup.start <= setup.stop <= call.start <= call.stop <= teardown.start


def test_the_body_time_is_the_call_phase_and_the_fixture_time_setup_and_teardown(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        f"""
        import time
        import harness
        import pytest

        @harness.fixture
        def slow():
            time.sleep({SETUP_S})
            yield
            time.sleep({TEARDOWN_S})

        @pytest.mark.distributed(world_size=2)
        def test_sleeps(rank, slow):
            time.sleep({BODY_S})

        @pytest.mark.distributed(world_size=2)
        def test_plain(rank):
            time.sleep({BODY_S})
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "--durations=0", "-vv")
    result.assert_outcomes(passed=2)
    found = phases(result, "test_sleeps")
    assert found["setup"].duration >= SETUP_S
    assert found["call"].duration >= BODY_S
    assert found["teardown"].duration >= TEARDOWN_S
    assert_in_order(found)
    plain = phases(result, "test_plain")
    assert plain["call"].duration >= BODY_S  # no fixtures: the body alone, still the call
    assert_in_order(plain)
    result.stdout.re_match_lines([r"\d+\.\d\ds call +test_.*::test_plain"])


def test_a_failing_body_takes_its_time_in_the_call_phase(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import time
        import pytest

        @pytest.mark.distributed(world_size=2)
        def test_fails(rank):
            time.sleep({BODY_S})
            assert rank == 5
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    found = phases(result, "test_fails")
    assert found["call"].failed
    assert found["call"].duration >= BODY_S
    assert_in_order(found)


def test_a_body_that_times_out_takes_its_time_in_the_call_phase(
    pytester: pytest.Pytester,
) -> None:
    # No rank says how long it took (each was killed at the deadline): the run's time is
    # the call's, the phase that reports the timeout.
    pytester.makepyfile(
        """
        import threading
        import pytest

        @pytest.mark.distributed(world_size=2, timeout=1)
        def test_hangs(rank):
            threading.Event().wait()
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    found = phases(result, "test_hangs")
    assert found["call"].failed
    assert "WorldTimeout" in str(found["call"].longrepr)
    assert found["call"].duration >= 1.0  # the deadline passed before the run ended
    assert_in_order(found)


def test_junit_xml_times_the_call_phase(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import time
        import pytest

        @pytest.mark.distributed(world_size=2)
        def test_sleeps(rank):
            time.sleep({BODY_S})
        """
    )
    xml = pytester.path / "junit.xml"
    result = pytester.runpytest(
        "-p", "no:randomly", f"--junitxml={xml}", "-o", "junit_duration_report=call"
    )
    result.assert_outcomes(passed=1)
    (case,) = ET.parse(xml).getroot().iter("testcase")
    assert float(case.attrib["time"]) >= BODY_S
