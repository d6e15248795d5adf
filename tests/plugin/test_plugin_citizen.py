"""The plugin next to other plugins and projects: a project's own ``distributed`` marker is
left alone, ini ``dist_marker`` renames ours, and a session that runs no distributed test
starts no forkserver and imports no torch for it."""

from __future__ import annotations

import ast
import sys

import pytest

# Ranks have RANK in their environment; the pytest process here does not.
OWN_MARKER_TESTS = """
import os
import pytest

@pytest.mark.distributed
def test_runs_here_as_the_project_wants():
    assert "RANK" not in os.environ, "not sent to ranks: the marker is the project's"

@pytest.mark.distributed(world_size=2)
def test_own_marker_with_arguments():
    assert "RANK" not in os.environ
"""


@pytest.mark.parametrize("declared_in", ["ini", "conftest"])
def test_a_projects_own_distributed_marker_is_left_alone(
    pytester: pytest.Pytester, declared_in: str
) -> None:
    if declared_in == "ini":
        pytester.makeini("[pytest]\nmarkers =\n    distributed: the project's own marker\n")
    else:
        pytester.makeconftest(
            """
            def pytest_configure(config):
                config.addinivalue_line("markers", "distributed: the project's own marker")
            """
        )
    pytester.makepyfile(OWN_MARKER_TESTS)
    result = pytester.runpytest("--strict-markers")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["harness: this project has a 'distributed' marker of its own, so fhelium's is off*"]
    )


def test_dist_marker_renames_ours(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\ndist_marker = multirank\nmarkers =\n    distributed: the project's own\n"
    )
    pytester.makepyfile(
        """
        import os
        import pytest
        import torch.distributed as dist

        @pytest.mark.multirank(world_size=2)
        def test_on_ranks(rank, world_size):
            assert os.environ["RANK"] == str(rank)
            assert dist.get_rank() == rank
            assert world_size == 2

        @pytest.mark.distributed
        def test_project_marker(request):
            assert "RANK" not in os.environ
        """
    )
    result = pytester.runpytest("--strict-markers")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["harness: tests marked 'multirank' run on the ranks*"])


def test_a_bad_dist_marker_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ndist_marker = not a name\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*ini option dist_marker must be a marker name (an identifier), got 'not a name'*"]
    )


REPORT_STARTED = """
import sys
from harness import compat

def pytest_sessionfinish(session):
    print(f"torch imported: {'torch' in sys.modules}; forkserver: {compat.forkserver_pid()}")
"""


@pytest.mark.parametrize(
    ("files", "args"),
    [
        pytest.param("marked", ["--collect-only"], id="collect-only"),
        pytest.param("marked", ["-k", "plain"], id="k-deselects"),
        pytest.param("marked", ["-m", "not distributed"], id="m-deselects"),
        pytest.param("word", [], id="file-mentions-the-word"),
        # Named on the command line, a file with distributed tests starts the server at once,
        # unless they may be deselected.
        pytest.param("marked", ["--collect-only", "test_files.py"], id="named-collect-only"),
        pytest.param("marked", ["-k", "plain", "test_files.py::test_plain"], id="named-k"),
        # xdist's controller runs no test (its worker does, and starts a server of its own;
        # the worker runs the plain test alone, as the controller's check needs no world).
        pytest.param(
            "marked", ["-n", "1", "test_files.py::test_plain"], id="named-xdist-controller"
        ),
    ],
)
def test_no_distributed_test_selected_starts_nothing(
    pytester: pytest.Pytester, files: str, args: list[str]
) -> None:
    pytester.makeconftest(REPORT_STARTED)
    if files == "marked":
        pytester.makepyfile(
            test_files="""
            import pytest

            def test_plain():
                pass

            @pytest.mark.distributed(world_size=2)
            def test_distributed(rank):
                pass
            """
        )
    else:
        pytester.makepyfile(
            test_files='''
            """Helpers for distributed training, tested without any distributed test."""

            def test_plain():
                assert "distributed" in __doc__
            '''
        )
    # A subprocess: this process has torch imported and a forkserver running already.
    result = pytester.runpytest_subprocess("-s", *args)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*torch imported: False; forkserver: None"])


SERVER_STARTED = """
from harness import compat

print(f"forkserver at conftest import: {compat.forkserver_pid() is not None}")

def pytest_sessionstart(session):
    print(f"forkserver at session start: {compat.forkserver_pid() is not None}")
"""

NAMED = """
import pytest

@pytest.mark.distributed(world_size=2)
def test_distributed(rank):
    pass
"""


def test_without_a_file_named_the_server_starts_after_the_conftests(
    pytester: pytest.Pytester,
) -> None:
    # A named file starts it before them (its torch import then overlaps the conftests'
    # imports, often torch through the library under test, pytest's header and collection):
    # a test id in test_pytest_does_not_rewrite_the_harnesss_own_modules, a file alone in
    # test_a_server_started_for_a_marker_a_conftest_then_claims_is_stopped. Without a file
    # named, collection finds the tests (and starts it).
    pytester.makeconftest(SERVER_STARTED)
    pytester.makepyfile(test_named=NAMED)
    result = pytester.runpytest_subprocess("-s")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["forkserver at conftest import: False", "forkserver at session start: False"]
    )


def test_a_server_started_for_a_marker_a_conftest_then_claims_is_stopped(
    pytester: pytest.Pytester,
) -> None:
    # Before the conftests load, the marker looks like ours; the conftest declares it as the
    # project's own, so nothing will run on ranks: the server is stopped at configure.
    pytester.makeconftest(
        SERVER_STARTED
        + """
def pytest_configure(config):
    config.addinivalue_line("markers", "distributed: the project's own marker")
"""
    )
    pytester.makepyfile(test_named=NAMED.replace("(rank)", "()"))
    result = pytester.runpytest_subprocess("-s", "test_named.py")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["forkserver at conftest import: True", "forkserver at session start: False"]
    )


def test_loading_the_plugin_imports_neither_torch_nor_the_harness_core(
    pytester: pytest.Pytester,
) -> None:
    # The plugin is loaded into every pytest run of an environment that has fhelium: what a
    # distributed test needs comes with the first one.
    heavy = ("torch", "harness.controller", "harness.rank", "multiprocessing", "unittest")
    result = pytester.run(
        sys.executable,
        "-c",
        "import sys, harness.plugin; "
        f"print('loaded:', sorted(m for m in sys.modules if m.startswith({heavy!r})))",
    )
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(["loaded: []"])


def test_pytest_does_not_rewrite_the_harnesss_own_modules(pytester: pytest.Pytester) -> None:
    # pytest rewrites every module of a plugin's distribution; where it cannot cache that
    # (read-only install, PYTHONDONTWRITEBYTECODE) it did so again in every run, ~0.1 s before
    # the first distributed test. The harness opts out before importing the rest of itself.
    # The same run shows a named test id starting the server before the conftests.
    pytester.makeconftest(
        SERVER_STARTED
        + """
import sys

def pytest_sessionfinish(session):
    rewritten = sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith(("harness.", "fhelium"))
        and type(getattr(module, "__loader__", None)).__name__ == "AssertionRewritingHook"
    )
    print(f"rewritten by pytest: {rewritten}")
"""
    )
    pytester.makepyfile(test_named=NAMED)
    result = pytester.runpytest_subprocess("-s", "test_named.py::test_distributed")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["forkserver at conftest import: True", "forkserver at session start: True"]
    )
    output = result.stdout.str()
    rewritten = ast.literal_eval(output.split("rewritten by pytest: ", 1)[1].splitlines()[0])
    if "harness.plugin" not in rewritten:
        pytest.skip("this pytest does not rewrite the plugin's modules in this install")
    # Only the plugin's module itself and what it imports before it can opt out; none of
    # what the first distributed test imports (the session, the controller, the world).
    before_opting_out = {
        "harness.compat",
        "harness.compat.coverage_api",
        "harness.compat.cpython",
        "harness.compat.hypothesis_api",
        "harness.compat.nanobind",
        "harness.compat.pytest_internals",
        "harness.compat.torch_collectives",
        "harness.compat.torch_groups",
        "harness.compat.torch_distributed",
        "harness.compat.torch_testing",
        "harness.errors",
        "harness.plugin",
        "harness.protocol",
        "harness.protocol.failures",
        "harness.protocol.schedules",
        "harness.protocol.traces",
        "harness.versions",
    }
    assert set(rewritten) <= before_opting_out, output
