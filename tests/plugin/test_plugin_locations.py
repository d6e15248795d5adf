"""Where a distributed test's skip and the harness's warnings about it point.

A skip raised in the ranks is reported at the line that raised it, as pytest reports a skip
(``-rs``), and a skip on some ranks only names each skipping rank's line; a warning about
what a test left behind in its ranks points at the test, not at the harness.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from plugin_testutil import reports

from harness.rank import sites


def line_of(path: Path, text: str) -> int:
    """The 1-based number of the first line of the file ``path`` that contains ``text``."""
    lines = path.read_text().splitlines()
    return 1 + next(number for number, line in enumerate(lines) if text in line)


def test_a_skip_is_reported_at_the_line_that_raised_it(pytester: pytest.Pytester) -> None:
    path = pytester.makepyfile(
        test_skips="""
        import unittest
        import harness
        import pytest

        @harness.fixture
        def unavailable():
            pytest.skip("no device here")

        @pytest.mark.distributed(world_size=2)
        def test_in_body(rank):
            x = 1
            pytest.skip("not on this machine")

        @pytest.mark.distributed(world_size=2)
        def test_unittest(rank):
            raise unittest.SkipTest("unittest says no")

        @pytest.mark.distributed(world_size=2)
        def test_in_fixture(rank, unavailable):
            pass
        """
    )
    result = pytester.runpytest("-rs", "-p", "no:randomly")
    result.assert_outcomes(skipped=3)
    body = line_of(path, 'pytest.skip("not on this machine")')
    unit = line_of(path, "raise unittest.SkipTest")
    fixture = line_of(path, 'pytest.skip("no device here")')
    result.stdout.fnmatch_lines(
        [
            f"SKIPPED [[]1[]] test_skips.py:{body}: not on this machine",
            f"SKIPPED [[]1[]] test_skips.py:{unit}: unittest says no",
            f"SKIPPED [[]1[]] test_skips.py:{fixture}: no device here",
        ],
        consecutive=True,
    )
    assert reports(result, "setup")["test_in_fixture"].skipped
    assert reports(result)["test_in_body"].longrepr[:2] == (str(path), body)


def test_a_skip_on_some_ranks_names_each_skipping_ranks_line(pytester: pytest.Pytester) -> None:
    path = pytester.makepyfile(
        test_partial="""
        import pytest

        @pytest.mark.distributed(world_size=3)
        def test_partial(rank):
            if rank == 1:
                pytest.skip("rank 1 has no data")
            if rank == 2:
                pytest.skip("rank 2 has none either")
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=1)
    one, two = line_of(path, "rank 1 has no data"), line_of(path, "none either")
    text = reports(result)["test_partial"].longreprtext
    assert (
        "ranks 1, 2 skipped but rank 0 did not; a distributed run must skip on every rank or on "
        f"none (rank 1 (test_partial.py:{one}): rank 1 has no data; rank 2 "
        f"(test_partial.py:{two}): rank 2 has none either)"
    ) in text
    assert f"{path}:{one}: Skipped: rank 1 has no data" in text


def test_a_leak_warning_points_at_the_test(pytester: pytest.Pytester) -> None:
    path = pytester.makepyfile(
        test_leak="""
        import threading
        import time
        import pytest

        @pytest.mark.distributed(world_size=2)
        def test_leaks(rank):
            threading.Thread(target=time.sleep, args=(3,), daemon=True).start()
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, warnings=1)
    test = line_of(path, "@pytest.mark.distributed")
    result.stdout.fnmatch_lines(
        [
            "test_leak.py::test_leaks",
            f"  {path}:{test}: RuntimeWarning: test test_leak.py::test_leaks left behind *",
        ]
    )
    assert "harness/" not in result.stdout.str()


def _skip_here() -> None:
    pytest.skip("from a helper")


def test_raised_at_is_the_innermost_frame_of_the_users_code() -> None:
    with pytest.raises(pytest.skip.Exception) as caught:
        _skip_here()
    code = _skip_here.__code__
    assert sites.raised_at(caught.value) == (code.co_filename, code.co_firstlineno + 1)
    assert sites.raised_at(ValueError("never raised")) is None
