"""The pure classification of what came back from the ranks (``classify``), without processes.

Every case is built from plain data: the messages a rank could have sent (``Done``, ``Failed``,
``Skipped``, ``Ready``), a ``Died`` for a rank whose process ended, or a missing key for a rank
that had not answered. Each test checks the exact outcome: values, skip, or the error with its
class, summary, failures in order, exit codes and stacks.
"""

from __future__ import annotations

import pickle
import unittest

import pytest

from harness.controller.classify import classify
from harness.controller.leak_reports import leak_error, leak_report
from harness.controller.outcome import Died, Evidence, Outcome, Reply
from harness.errors import DistributedError, RankCrash, RankError, RankLeak, WorldTimeout
from harness.protocol.failures import EXIT_MAIN_REIMPORTED, MAIN_GUARD_HINT, RankFailure
from harness.protocol.messages import Done, Failed, Ready, Skipped

START = "a world of 3 ranks (gloo)"


def boom(rank: int, message: str = "boom") -> RankFailure:
    """The failure of a rank that raised ``ValueError(message)``."""
    return RankFailure(rank, "ValueError", message, f"Traceback...\nValueError: {message}\n")


def failed(rank: int, at: float, message: str = "boom") -> Failed:
    return Failed(boom(rank, message), at)


def done(value: object, *, reusable: bool = True) -> Done:
    return Done(pickle.dumps(value), reusable)


def ready() -> Ready:
    return Ready(main_thread=1, watchdog_thread=2, code_dir="/harness")


def headings(error: DistributedError) -> list[str]:
    """The section headings of ``str(error)``, in order."""
    return [line.strip("- ") for line in str(error).splitlines() if line.startswith("---------- ")]


def error_of(outcome: Outcome) -> DistributedError:
    assert outcome.values is None
    assert outcome.skip is None
    assert outcome.error is not None
    return outcome.error


# ---------------------------------------------------------------- values


def test_all_done_gives_values_in_rank_order() -> None:
    replies: dict[int, Reply] = {2: done("two"), 0: done({"zero": 0}), 1: done([1])}
    outcome = classify(Evidence(replies, 3, timeout=5.0))
    assert outcome.error is None
    assert outcome.skip is None
    assert outcome.values == [{"zero": 0}, [1], "two"]
    assert outcome.reusable is True
    assert outcome.result() == [{"zero": 0}, [1], "two"]


def test_one_unreusable_done_makes_the_outcome_unreusable() -> None:
    replies: dict[int, Reply] = {0: done(0), 1: done(1, reusable=False), 2: done(2)}
    outcome = classify(Evidence(replies, 3, timeout=5.0))
    assert outcome.error is None
    assert outcome.values == [0, 1, 2]
    assert outcome.reusable is False


def test_a_value_that_does_not_unpickle_is_a_rank_error_naming_the_rank() -> None:
    replies: dict[int, Reply] = {0: done(0), 1: Done(b"not a pickle"), 2: done(2)}
    error = error_of(classify(Evidence(replies, 3, timeout=5.0)))
    assert type(error) is RankError
    assert error.summary.startswith(
        "could not unpickle the return value of rank 1: UnpicklingError: "
    )
    assert list(error.failures) == [1]
    failure = error.failures[1]
    assert failure.rank == 1
    assert failure.exc_type == "UnpicklingError"
    assert failure.message == error.summary
    assert failure.traceback == error.summary + "\n"
    with pytest.raises(RankError) as excinfo:
        classify(Evidence(replies, 3, timeout=5.0)).result()
    assert excinfo.value.summary == error.summary


# ---------------------------------------------------------------- skips


@pytest.mark.parametrize(
    ("kind", "exception"),
    [("unittest", unittest.SkipTest), ("pytest", pytest.skip.Exception)],
)
def test_all_skipped_gives_the_earliest_skip(kind: str, exception: type[BaseException]) -> None:
    replies: dict[int, Reply] = {
        0: Skipped("late", kind, at=3.0),
        1: Skipped("first", kind, at=1.0),
        2: Skipped("middle", kind, at=2.0),
    }
    outcome = classify(Evidence(replies, 3, timeout=5.0))
    assert outcome.error is None
    assert outcome.values is None
    assert outcome.skip == Skipped("first", kind, at=1.0)
    with pytest.raises(exception) as excinfo:
        outcome.result()
    assert type(excinfo.value) is exception
    assert str(excinfo.value) == "first"


def test_skip_on_some_ranks_only_is_a_rank_error() -> None:
    replies: dict[int, Reply] = {
        0: done(0),
        1: Skipped("no GPU", "pytest", at=1.0),
        2: done(2),
    }
    error = error_of(classify(Evidence(replies, 3, timeout=5.0)))
    assert type(error) is RankError
    assert error.summary == (
        "rank 1 skipped but ranks 0, 2 did not; a distributed run must skip on every rank "
        "or on none (rank 1: no GPU)"
    )
    assert list(error.failures) == [1]
    assert error.failures[1] == RankFailure(1, "Skipped", "no GPU", "Skipped: no GPU\n")


def test_skips_on_several_ranks_list_reasons_by_rank_and_failures_by_time() -> None:
    replies: dict[int, Reply] = {
        0: Skipped("zero", "unittest", at=2.0),
        1: done(1),
        2: Skipped("two", "unittest", at=1.0),
    }
    error = error_of(classify(Evidence(replies, 3, timeout=5.0)))
    assert type(error) is RankError
    assert error.summary == (
        "ranks 0, 2 skipped but rank 1 did not; a distributed run must skip on every rank "
        "or on none (rank 0: zero; rank 2: two)"
    )
    assert list(error.failures) == [2, 0]
    assert [f.exc_type for f in error.failures.values()] == ["Skipped", "Skipped"]


# ---------------------------------------------------------------- RankError


def test_one_failure_is_a_rank_error_naming_the_ranks_torn_down() -> None:
    error = error_of(classify(Evidence({1: failed(1, at=1.0)}, 3, timeout=5.0)))
    assert type(error) is RankError
    assert error.summary == "rank 1 raised ValueError: boom; ranks 0, 2 torn down"
    assert list(error.failures) == [1]
    assert error.failures[1] == boom(1)
    assert headings(error) == ["rank 1"], "a single failure is not headed root cause"
    assert str(error) == (
        "rank 1 raised ValueError: boom; ranks 0, 2 torn down\n"
        "\n---------- rank 1 ----------\n"
        "Traceback...\nValueError: boom"
    )


def test_failures_are_ordered_by_time_not_by_rank() -> None:
    replies: dict[int, Reply] = {
        0: failed(0, at=2.0, message="later"),
        1: failed(1, at=1.0, message="first"),
    }
    error = error_of(classify(Evidence(replies, 3, timeout=5.0)))
    assert type(error) is RankError
    assert error.summary == "rank 1 raised ValueError: first; then rank 0 failed; rank 2 torn down"
    assert list(error.failures) == [1, 0]
    assert error.failures[1] == boom(1, "first")
    assert error.failures[0] == boom(0, "later")
    assert headings(error) == ["rank 1 (root cause)", "rank 0"]


def test_failures_at_the_same_time_are_ordered_by_rank() -> None:
    replies: dict[int, Reply] = {2: failed(2, at=1.0), 0: failed(0, at=1.0)}
    error = error_of(classify(Evidence(replies, 3, timeout=None)))
    assert list(error.failures) == [0, 2]
    assert error.summary == "rank 0 raised ValueError: boom; then rank 2 failed; rank 1 torn down"


# ---------------------------------------------------------------- RankCrash


def test_a_death_first_in_time_is_a_rank_crash() -> None:
    replies: dict[int, Reply] = {0: Died(-9, at=1.0, dump="Fatal Python error: ...\n")}
    error = error_of(classify(Evidence(replies, 2, timeout=5.0)))
    assert type(error) is RankCrash
    assert error.summary == "rank 0 was killed by SIGKILL (exit code -9); rank 1 torn down"
    assert error.exitcodes == {0: -9}
    assert list(error.failures) == [0]
    assert error.failures[0] == RankFailure(
        0,
        "RankCrash",
        "the process was killed by SIGKILL (exit code -9)",
        "Fatal Python error: ...\n",
    )
    assert headings(error) == ["rank 0"]


def test_a_death_without_others_missing_names_no_ranks_torn_down() -> None:
    replies: dict[int, Reply] = {0: Died(-9, at=1.0), 1: done(1)}
    error = error_of(classify(Evidence(replies, 2, timeout=5.0)))
    assert type(error) is RankCrash
    assert error.summary == "rank 0 was killed by SIGKILL (exit code -9)"
    assert error.exitcodes == {0: -9}
    # Without a dump the section falls back to the one-line account.
    assert str(error).endswith("RankCrash: the process was killed by SIGKILL (exit code -9)")


@pytest.mark.parametrize(
    ("exitcode", "recorded", "how"),
    [
        (None, 0, "closed its connection without exiting"),
        (3, 3, "exited with code 3"),
        (-11, -11, "was killed by SIGSEGV (exit code -11)"),
    ],
)
def test_how_a_rank_died(exitcode: int | None, recorded: int, how: str) -> None:
    replies: dict[int, Reply] = {1: Died(exitcode, at=1.0), 0: done(0)}
    error = error_of(classify(Evidence(replies, 2, timeout=5.0)))
    assert type(error) is RankCrash
    assert error.summary == f"rank 1 {how}"
    assert error.exitcodes == {1: recorded}
    assert error.failures[1].message == f"the process {how}"
    assert error.failures[1].exc_type == "RankCrash"


def test_a_crash_then_a_failure_keeps_every_exitcode() -> None:
    replies: dict[int, Reply] = {
        2: Died(-9, at=1.0, dump="dump two\n"),
        0: failed(0, at=2.0),
        1: Died(None, at=3.0),
    }
    error = error_of(classify(Evidence(replies, 3, timeout=5.0)))
    assert type(error) is RankCrash
    assert error.summary == ("rank 2 was killed by SIGKILL (exit code -9); then ranks 0, 1 failed")
    assert list(error.failures) == [2, 0, 1]
    assert error.exitcodes == {2: -9, 1: 0}
    assert error.failures[2].traceback == "dump two\n"
    assert error.failures[0] == boom(0)
    assert headings(error) == ["rank 2 (root cause)", "rank 0", "rank 1"]


# ---------------------------------------------------------------- mixed


def test_a_failure_before_a_death_is_a_rank_error_listing_both() -> None:
    replies: dict[int, Reply] = {0: Died(-9, at=2.0, dump="dump\n"), 1: failed(1, at=1.0)}
    error = error_of(classify(Evidence(replies, 3, timeout=5.0)))
    assert type(error) is RankError
    assert error.summary == "rank 1 raised ValueError: boom; then rank 0 failed; rank 2 torn down"
    assert list(error.failures) == [1, 0]
    assert error.failures[1] == boom(1)
    assert error.failures[0] == RankFailure(
        0, "RankCrash", "the process was killed by SIGKILL (exit code -9)", "dump\n"
    )
    assert headings(error) == ["rank 1 (root cause)", "rank 0"]


def test_skips_beside_a_failure_are_listed_after_the_failures() -> None:
    replies: dict[int, Reply] = {
        0: Skipped("not here", "pytest", at=0.5),
        1: failed(1, at=2.0),
        2: failed(2, at=1.0),
    }
    error = error_of(classify(Evidence(replies, 4, timeout=5.0)))
    assert type(error) is RankError
    assert list(error.failures) == [2, 1, 0], "failures in time, then skips (even earlier ones)"
    assert error.failures[0] == RankFailure(0, "Skipped", "not here", "Skipped: not here\n")
    assert error.summary == (
        "rank 2 raised ValueError: boom; then ranks 0, 1 failed; rank 3 torn down"
    )
    assert headings(error) == ["rank 2 (root cause)", "rank 1", "rank 0"]


# ---------------------------------------------------------------- WorldTimeout


def test_ranks_that_did_not_answer_without_a_failure_are_a_world_timeout() -> None:
    stacks = {0: "stack zero\n", 1: "stack one\n", 2: "stack two\n"}
    replies: dict[int, Reply] = {0: done(0), 2: done(2)}
    error = error_of(classify(Evidence(replies, 3, timeout=5.0, stacks=stacks)))
    assert type(error) is WorldTimeout
    assert error.summary == (
        "the run did not finish within 5 s: rank 1 still running "
        "(their stacks at the deadline follow; the ranks were then killed)"
    )
    assert list(error.failures) == [1]
    assert error.failures[1] == RankFailure(
        1, "WorldTimeout", "still running after 5 s", "stack one\n"
    )
    assert error.stacks == stacks
    assert headings(error) == ["rank 1"]


def test_a_world_timeout_lists_the_silent_ranks_by_rank() -> None:
    stacks = {0: "stack zero\n", 2: "stack two\n"}
    error = error_of(classify(Evidence({1: done(1)}, 3, timeout=0.5, stacks=stacks)))
    assert type(error) is WorldTimeout
    assert error.summary.startswith("the run did not finish within 0.5 s: ranks 0, 2 still running")
    assert list(error.failures) == [0, 2]
    assert [f.message for f in error.failures.values()] == ["still running after 0.5 s"] * 2
    assert error.stacks == {0: "stack zero\n", 1: "", 2: "stack two\n"}
    assert headings(error) == ["rank 0", "rank 2"], "listed by rank: no root cause"


def test_a_world_timeout_without_a_bound() -> None:
    error = error_of(classify(Evidence({}, 2, timeout=None)))
    assert type(error) is WorldTimeout
    assert error.summary == (
        "the run did not finish: ranks 0, 1 still running "
        "(their stacks at the deadline follow; the ranks were then killed)"
    )
    assert list(error.failures) == [0, 1]
    assert error.failures[0] == RankFailure(0, "WorldTimeout", "still running", "")
    assert error.stacks == {0: "", 1: ""}
    assert str(error).endswith("---------- rank 1 ----------\nWorldTimeout: still running")


# ---------------------------------------------------------------- start of a world


def test_a_world_whose_ranks_are_all_ready_started() -> None:
    replies: dict[int, Reply] = {rank: ready() for rank in range(3)}
    outcome = classify(Evidence(replies, 3, timeout=60.0, starting=START))
    assert outcome.error is None
    assert outcome.skip is None
    assert outcome.result() == []


def test_a_world_that_did_not_start_lists_its_ranks_by_rank() -> None:
    replies: dict[int, Reply] = {0: ready(), 1: failed(1, at=1.0)}
    stacks = {2: "stack two\n"}
    error = error_of(classify(Evidence(replies, 3, timeout=60.0, stacks=stacks, starting=START)))
    assert type(error) is DistributedError
    assert error.summary == f"{START} did not start: rank 1, rank 2 did not come up"
    assert list(error.failures) == [1, 2]
    assert error.failures[1] == boom(1)
    assert error.failures[2] == RankFailure(
        2,
        "WorldTimeout",
        "not up after 60 s (or torn down after a peer failed)",
        "stack two\n",
    )
    assert headings(error) == ["rank 1", "rank 2"], "listed by rank: no root cause"


def test_a_world_that_did_not_start_is_listed_by_rank_not_by_time() -> None:
    replies: dict[int, Reply] = {0: failed(0, at=2.0), 1: ready(), 2: failed(2, at=1.0)}
    error = error_of(classify(Evidence(replies, 3, timeout=None, starting=START)))
    assert type(error) is DistributedError
    assert list(error.failures) == [0, 2]
    assert error.summary == f"{START} did not start: rank 0, rank 2 did not come up"


def test_a_rank_that_died_during_start_is_a_crash_failure() -> None:
    replies: dict[int, Reply] = {0: ready(), 1: Died(-9, at=1.0, dump="dump\n")}
    error = error_of(classify(Evidence(replies, 3, timeout=None, starting=START)))
    assert type(error) is DistributedError
    assert error.summary == f"{START} did not start: rank 1, rank 2 did not come up"
    assert list(error.failures) == [1, 2]
    assert error.failures[1] == RankFailure(
        1, "RankCrash", "the process was killed by SIGKILL (exit code -9)", "dump\n"
    )
    assert error.failures[2] == RankFailure(
        2, "WorldTimeout", "not up (or torn down after a peer failed)", ""
    )
    assert error.hint == ""


def test_ranks_that_reimported_a_main_module_without_a_guard_get_the_hint_last() -> None:
    replies: dict[int, Reply] = {r: Died(EXIT_MAIN_REIMPORTED, at=1.0) for r in range(3)}
    error = error_of(classify(Evidence(replies, 3, timeout=60.0, starting=START)))
    assert error.hint == MAIN_GUARD_HINT
    assert str(error).endswith('under `if __name__ == "__main__":`.')
    assert error.failures[0].message == (
        "the process exited with code 86: it re-imported the main module, which starts a "
        "world at import time"
    )


def test_group_counters_out_of_step_make_a_successful_call_unfit_for_the_next() -> None:
    replies: dict[int, Reply] = {
        0: Done(pickle.dumps(0), True, group_count=3),
        1: Done(pickle.dumps(1), True, group_count=2),
    }
    outcome = classify(Evidence(replies, 2, timeout=None))
    assert outcome.error is None
    assert outcome.values == [0, 1]
    assert outcome.reusable is False
    assert "process-group counters out of step (rank 0: 3, rank 1: 2)" in outcome.notice
    in_step = {rank: Done(pickle.dumps(rank), True, group_count=3) for rank in (0, 1)}
    assert classify(Evidence(in_step, 2, timeout=None)).notice == ""


def test_default_group_gone_on_every_rank_asks_for_a_fresh_one_on_the_same_ranks() -> None:
    replies: dict[int, Reply] = {
        rank: Done(pickle.dumps(rank), True, group_count=0, grouped=False) for rank in (0, 1)
    }
    outcome = classify(Evidence(replies, 2, timeout=None))
    assert outcome.values == [0, 1]
    assert outcome.reusable is True
    assert outcome.regroup is True
    assert outcome.notice == ""
    kept = {rank: Done(pickle.dumps(rank), True, group_count=1) for rank in (0, 1)}
    assert classify(Evidence(kept, 2, timeout=None)).regroup is False


def test_default_group_gone_on_some_ranks_only_makes_the_call_unfit_and_says_so() -> None:
    replies: dict[int, Reply] = {
        0: Done(pickle.dumps(0), True, group_count=1),
        1: Done(pickle.dumps(1), True, group_count=0, grouped=False),
        2: Done(pickle.dumps(2), True, group_count=0, grouped=False),
    }
    outcome = classify(Evidence(replies, 3, timeout=None))
    assert outcome.error is None
    assert outcome.values == [0, 1, 2]
    assert outcome.reusable is False
    assert outcome.regroup is False
    # Named once, for the default group: the counters differ only because of it.
    assert outcome.notice == (
        "the call destroyed the default process group on ranks 1, 2 only (rank 0 kept it), "
        "which leaves the ranks out of step; the world is rebuilt before the next call"
    )


def test_without_a_harness_group_the_groups_a_call_leaves_never_make_it_unfit() -> None:
    # init=False: every group, the default one included, is destroyed before the next call.
    replies: dict[int, Reply] = {
        0: Done(pickle.dumps(0), True, group_count=3, grouped=False),
        1: Done(pickle.dumps(1), True, group_count=2, grouped=False),
    }
    outcome = classify(Evidence(replies, 2, timeout=None, init=False))
    assert outcome.values == [0, 1]
    assert (outcome.reusable, outcome.regroup, outcome.notice) == (True, False, "")
    unfit = {0: Done(pickle.dumps(0), False, grouped=False), 1: Done(pickle.dumps(1))}
    assert classify(Evidence(unfit, 2, timeout=None, init=False)).reusable is False


THREAD = "thread 'worker-1' started at test_x.py:12 is still alive"


def test_what_ranks_left_behind_is_kept_by_rank_and_reported_once_per_finding() -> None:
    replies: dict[int, Reply] = {
        0: Done(pickle.dumps(0), leaks=(THREAD, "child process 41 (sleep 1000) is still running")),
        1: Done(pickle.dumps(1), leaks=(THREAD,)),
        2: Done(pickle.dumps(2)),
    }
    outcome = classify(Evidence(replies, 3, timeout=None))
    assert outcome.error is None
    assert outcome.values == [0, 1, 2]
    assert outcome.reusable is True  # a leak alone does not rebuild the world ("warn")
    assert outcome.leaks == {
        0: (THREAD, "child process 41 (sleep 1000) is still running"),
        1: (THREAD,),
    }
    assert leak_report(outcome.leaks, "test test_x.py::test_a") == (
        "test test_x.py::test_a left behind in a reused rank: "
        f"ranks 0, 1: {THREAD}; rank 0: child process 41 (sleep 1000) is still running"
    )
    clean = {rank: Done(pickle.dumps(rank)) for rank in (0, 1)}
    assert classify(Evidence(clean, 2, timeout=None)).leaks == {}


def test_leaks_as_an_error_name_the_call_the_ranks_and_each_finding() -> None:
    replies: dict[int, Reply] = {
        0: Done(pickle.dumps(0), leaks=(THREAD, "file descriptor 17 (/tmp/f) is still open")),
        1: Done(pickle.dumps(1), leaks=(THREAD,)),
    }
    outcome = classify(Evidence(replies, 2, timeout=None))
    outcome.outputs = {0: ("out", ""), 1: ("", "")}
    failed = leak_error(outcome, "test test_x.py::test_a")
    assert failed.values is None
    assert failed.reusable is False
    assert failed.outputs == outcome.outputs
    error = failed.error
    assert isinstance(error, RankLeak)
    assert isinstance(error, DistributedError)
    assert error.summary == (
        f"test test_x.py::test_a left behind on ranks 0, 1: {THREAD} (and 1 more, below); "
        "the ranks were stopped"
    )
    assert list(error.failures) == [0, 1]
    assert error.failures[0] == RankFailure(
        0,
        "RankLeak",
        f"{THREAD}; file descriptor 17 (/tmp/f) is still open",
        f"{THREAD}\nfile descriptor 17 (/tmp/f) is still open\n",
    )
    assert f"---------- rank 1 ----------\n{THREAD}" in str(error)
    with pytest.raises(RankLeak):
        failed.result()
