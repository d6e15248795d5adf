"""What a distributed test's report says: outcome of all ranks, rank-tagged tracebacks root
cause first, per-rank output sections, skips, xfail, timeouts and crashes, in every output
mode; and that a bad test never changes the outcome of the next one."""

from __future__ import annotations

import re
import time

import pytest
from plugin_testutil import assert_no_internal_frames, reports

FAILING = """\
import sys
import pytest
import torch.distributed as dist

@pytest.mark.distributed(world_size=2)
def test_fail(rank):
    print(f"stdout of rank {rank}")
    print(f"stderr of rank {rank}", file=sys.stderr)
    dist.barrier()  # every rank has printed before rank 1 fails, however slow rank 0 is
    if rank == 1:
        values = [1, 2]
        assert values == [1, 3]
    dist.barrier()

@pytest.mark.distributed(world_size=2)
def test_pass(rank):
    print(f"passing rank {rank}")
"""


def test_pass_needs_every_rank_and_output_goes_to_rank_sections(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(FAILING)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    reps = reports(result)

    passed = reps["test_pass"]
    assert passed.passed
    assert [title for title, _ in passed.sections] == [
        "Captured rank 0 stdout call",
        "Captured rank 1 stdout call",
    ]
    assert dict(passed.sections)["Captured rank 1 stdout call"] == "passing rank 1\n"

    failed = reps["test_fail"]
    assert failed.failed
    sections = dict(failed.sections)
    assert sorted(sections) == [
        "Captured rank 0 stderr call",
        "Captured rank 0 stdout call",
        "Captured rank 1 stderr call",
        "Captured rank 1 stdout call",
    ]
    assert sections["Captured rank 0 stdout call"] == "stdout of rank 0\n"
    assert sections["Captured rank 1 stderr call"] == "stderr of rank 1\n"

    text = failed.longreprtext
    assert text.startswith("RankError: rank 1 raised AssertionError: assert [1, 2] == [1, 3]")
    # The root cause shows the failing line, with pytest's assertion explanation.
    assert text.index("-- rank 1") < text.index("assert values == [1, 3]")
    if _peer_reported(text):
        # Rank 0's barrier lost its peer: a consequence, listed after the root cause.
        other = text.index("-- rank 0 --")
        assert text.index("assert values == [1, 3]") < other
        assert "dist.barrier()" in text[other:]
    assert failed.longrepr.reprcrash.message.startswith("RankError: rank 1 raised")
    assert failed.longrepr.reprcrash.path.endswith(
        "test_pass_needs_every_rank_and_output_goes_to_rank_sections.py"
    )
    assert_no_internal_frames(text)


def _peer_reported(text: str) -> bool:
    """Whether rank 0, whose barrier lost rank 1, reported its failure within the grace
    period after the root cause, rather than being torn down (a loaded machine)."""
    if "then rank 0 failed" in text:
        return True
    assert "rank 0 torn down" in text, text
    return False


@pytest.mark.parametrize("option", ["-q", "-v", "-rA", "--tb=short", "--tb=long"])
def test_output_reads_well(pytester: pytest.Pytester, option: str) -> None:
    pytester.makepyfile(test_out=FAILING)
    result = pytester.runpytest(option)
    result.assert_outcomes(passed=1, failed=1)
    peer = _peer_reported(result.stdout.str())
    consequence = [
        "*- rank 0 -*",
        "Traceback (most recent call last):",
        '  File "*test_out.py", line 13, in test_fail',
        "    dist.barrier()",
    ]
    result.stdout.fnmatch_lines(
        [
            "*= FAILURES =*",
            "*_ test_fail _*",
            "RankError: rank 1 raised AssertionError: assert [[]1, 2] == [[]1, 3]; "
            + ("then rank 0 failed" if peer else "rank 0 torn down"),
            "*- rank 1 (root cause) -*" if peer else "*- rank 1 -*",
            "Traceback (most recent call last):",
            '  File "*test_out.py", line 12, in test_fail',
            "    assert values == [[]1, 3]",
            "AssertionError: assert [[]1, 2] == [[]1, 3]",
            *(consequence if peer else []),
            "*- Captured rank 0 stdout call -*",
            "stdout of rank 0",
            "*- Captured rank 0 stderr call -*",
            "stderr of rank 0",
            "*- Captured rank 1 stdout call -*",
            "stdout of rank 1",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED test_out.py::test_fail - RankError: rank 1 raised*"])
    if option == "-v":
        result.stdout.fnmatch_lines(
            ["test_out.py::test_fail FAILED*", "test_out.py::test_pass PASSED*"]
        )
    if option == "-rA":
        result.stdout.fnmatch_lines(
            [
                "*= PASSES =*",
                "*_ test_pass _*",
                "*- Captured rank 0 stdout call -*",
                "passing rank 0",
                "*- Captured rank 1 stdout call -*",
                "passing rank 1",
                "*short test summary info*",
                "PASSED test_out.py::test_pass",
            ]
        )
    assert_no_internal_frames(result.stdout.str())


def test_skip_on_every_rank_is_a_skip_pointing_at_the_line_that_raised_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_skips="""
        import unittest
        import pytest

        @pytest.mark.distributed(world_size=2)
        def test_pytest_skip(rank):
            pytest.skip("not on this machine")

        @pytest.mark.distributed(world_size=2)
        def test_unittest_skip(rank):
            raise unittest.SkipTest("unittest says no")

        @pytest.mark.distributed(world_size=2)
        def test_after(rank):
            pass
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] test_skips.py:6: not on this machine",
            "SKIPPED [[]1[]] test_skips.py:10: unittest says no",
        ]
    )
    for name in ("test_pytest_skip", "test_unittest_skip"):
        path, _, _ = reports(result)[name].longrepr
        assert path.endswith("test_skips.py")
    assert_no_internal_frames(result.stdout.str())


def test_skip_on_some_ranks_fails_naming_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distributed(world_size=3)
        def test_partial(rank):
            if rank == 1:
                pytest.skip("only rank 1 skips")

        @pytest.mark.distributed(world_size=3)
        def test_after(rank):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    text = reports(result)["test_partial"].longreprtext
    assert "rank 1 skipped but ranks 0, 2 did not" in text
    assert "only rank 1 skips" in text


def test_xfail_raises_is_matched_against_the_root_cause(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch.distributed as dist

        class MyError(Exception):
            pass

        @pytest.mark.distributed(world_size=2)
        @pytest.mark.xfail(raises=ValueError, reason="rank 1 raises ValueError")
        def test_same_type(rank):
            if rank == 1:
                raise ValueError("expected")
            dist.barrier()

        @pytest.mark.distributed(world_size=2)
        @pytest.mark.xfail(raises=LookupError)
        def test_builtin_base_class(rank):
            raise KeyError(rank)

        @pytest.mark.distributed(world_size=2)
        @pytest.mark.xfail(raises=MyError)
        def test_own_type(rank):
            raise MyError(rank)

        @pytest.mark.distributed(world_size=2)
        @pytest.mark.xfail(raises=TypeError)
        def test_other_type_fails(rank):
            raise ValueError("not the expected kind")
        """
    )
    result = pytester.runpytest("-rxXf")
    result.assert_outcomes(xfailed=3, failed=1)
    result.stdout.fnmatch_lines(["*RankError: rank * raised ValueError: not the expected kind*"])


def test_xfail_applies_to_the_test_as_a_whole(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=2)
        @pytest.mark.xfail(reason="known bug on rank 1")
        def test_expected_failure(rank):
            assert rank == 0
            dist.barrier()

        @pytest.mark.xfail(reason="imperative")
        @pytest.mark.distributed(world_size=2)
        def test_xfail_marker_below(rank):
            raise ValueError(rank)

        @pytest.mark.distributed(world_size=2)
        def test_imperative_xfail(rank):
            pytest.xfail("not yet")

        @pytest.mark.distributed(world_size=2)
        @pytest.mark.xfail(reason="fixed already", strict=False)
        def test_unexpected_pass(rank):
            pass

        @pytest.mark.distributed(world_size=2)
        @pytest.mark.xfail(reason="must fail", strict=True)
        def test_strict_pass(rank):
            pass

        @pytest.mark.distributed(world_size=2)
        def test_after(rank):
            pass
        """
    )
    result = pytester.runpytest("-rxXf")
    result.assert_outcomes(passed=1, xfailed=3, xpassed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED *::test_strict_pass*"])
    reps = reports(result)
    assert reps["test_expected_failure"].skipped
    assert reps["test_expected_failure"].wasxfail == "known bug on rank 1"
    assert reps["test_imperative_xfail"].wasxfail == "not yet"


def test_timeout_reports_every_rank_stack_and_the_session_goes_on(
    pytester: pytest.Pytester,
) -> None:
    # The deadline is the marker's, which wins over --dist-timeout; the option and the ini
    # value reach the same per-test timeout (tests/unit/test_unit_settings.py for the order,
    # tests/unit/test_unit_timeout_sources.py for pytest's real option and ini).
    # The tests around test_hang have bounds of their own: the first imports the module in
    # the ranks (so that at test_hang's deadline they sleep rather than import, also on a
    # loaded machine), the last runs on the rebuilt world's fresh ranks.
    pytester.makepyfile(
        test_hang="""
        import time
        import pytest

        @pytest.mark.distributed(world_size=2, timeout=120)
        def test_before(rank):
            pass

        @pytest.mark.distributed(world_size=2, timeout=1)
        def test_hang(rank):
            time.sleep(3600)

        @pytest.mark.distributed(world_size=2, timeout=120)
        def test_after(rank):
            pass
        """
    )
    started = time.monotonic()
    # The marker wins over the option.
    result = pytester.runpytest("-p", "no:randomly", "--dist-timeout", "300")
    assert time.monotonic() - started < 300  # not the hour test_hang would sleep
    result.assert_outcomes(passed=2, failed=1)
    text = reports(result)["test_hang"].longreprtext
    assert text.startswith("WorldTimeout: the run did not finish within 1 s: ranks 0, 1")
    for rank in (0, 1):
        section = text.split(f"-- rank {rank} --", 1)[1]
        assert 'test_hang.py", line 10, in test_hang' in section
        assert "time.sleep(3600)" in section
    assert_no_internal_frames(text)


def test_crash_names_the_signal_and_the_session_goes_on(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_crash="""
        import os
        import signal
        import pytest
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=2)
        def test_segfault(rank):
            if rank == 0:
                os.kill(os.getpid(), signal.SIGSEGV)
            dist.barrier()

        @pytest.mark.distributed(world_size=2)
        def test_after_segfault(rank):
            dist.barrier()

        @pytest.mark.distributed(world_size=2)
        def test_exit(rank):
            if rank == 1:
                os._exit(3)
            dist.barrier()

        @pytest.mark.distributed(world_size=2)
        def test_after_exit(rank):
            dist.barrier()
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2, failed=2)
    reps = reports(result)
    text = reps["test_segfault"].longreprtext
    assert text.startswith("RankCrash: rank 0 was killed by SIGSEGV")
    # Rank 1's barrier fails as a consequence, or (on a loaded machine, after the grace
    # period) rank 1 is torn down: either way rank 0 leads.
    assert "rank 0 (root cause)" in text or "rank 1 torn down" in text.splitlines()[0]
    assert "os.kill(os.getpid(), signal.SIGSEGV)" in text
    assert reps["test_exit"].longreprtext.startswith("RankCrash: rank 1 ")
    assert "exited with code 3" in reps["test_exit"].longreprtext.splitlines()[0]
    assert_no_internal_frames(text)


def test_an_assert_is_explained_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        def half(rank):
            return rank / 2

        @pytest.mark.distributed(world_size=2)
        def test_assert(rank):
            assert half(rank) == 0.0
        """
    )
    result = pytester.runpytest("-rf")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    # The headline carries the assert's first line (then "; rank 0 torn down" when rank 0
    # was slower than the grace period); pytest's explanation is in the traceback.
    headline = next(line for line in text.splitlines() if line.startswith("RankError: "))
    assert headline.startswith("RankError: rank 1 raised AssertionError: assert 0.5 == 0.0")
    assert "where" not in headline
    assert text.count("+  where 0.5 = half(1)") == 1, text
    result.stdout.fnmatch_lines(["FAILED *::test_assert - RankError: rank 1 r*"])


def test_with_s_each_line_says_its_rank_and_stays_whole(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys
        import pytest

        @pytest.mark.distributed(world_size=2)
        def test_hello(rank, world_size):
            for i in range(50):
                print(f"hello from rank {rank} of {world_size}", end="")
                print(f" line {i}")
            print(f"to stderr from rank {rank}", file=sys.stderr)
            print(f"unterminated from rank {rank}", end="")
        """
    )
    # A subprocess: its ranks write to its own stdout, where pytester can read them.
    result = pytester.runpytest_subprocess("-s", "-q")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    found = re.findall(r"\[rank (\d)\] hello from rank (\d) of 2 line (\d+)\n", out)
    for rank in "01":
        # Every line whole, in order, under its own rank's prefix.
        assert [int(i) for r, same, i in found if r == rank and same == rank] == list(range(50))
        assert f"[rank {rank}] unterminated from rank {rank}\n" in out
        assert f"[rank {rank}] to stderr from rank {rank}" in result.stderr.str()
    assert len(found) == 100, out
