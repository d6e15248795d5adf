"""Where fixtures run: in the controller unless they must run in the ranks.

Fixtures built from rank-side ones, pytest's per-process built-ins and ``harness.fixture``
run inside each rank, with their scopes and ``yield`` teardown there; a rank-side fixture's
failure is the test's setup or teardown error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from plugin_testutil import reports


def test_a_fixture_built_from_rank_runs_in_the_ranks(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def tag(rank):
            return f"r{rank}"

        @pytest.fixture
        def label(tag, world_size, tmp_path):
            return f"{tag}/{world_size}", tmp_path
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distributed(world_size=2)
        def test_tag(rank, tag, label, tmp_path):
            assert tag == f"r{rank}"
            assert label == (f"r{rank}/2", tmp_path)  # tmp_path: the controller's, shared

        class TestInClass:
            @pytest.fixture
            def doubled(self, rank):
                return self.factor * rank

            def setup_method(self):
                self.factor = 2

            @pytest.mark.distributed(world_size=2)
            def test_method_fixture(self, rank, doubled):
                assert doubled == 2 * rank
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)


def test_monkeypatch_is_undone_in_the_rank_pass_or_fail(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        settings="VALUE = 'original'\n",
        test_patch="""
        import os

        import pytest

        import settings

        @pytest.mark.distributed(world_size=2)
        def test_a_patches(rank, monkeypatch):
            monkeypatch.setattr(settings, "VALUE", f"patched by {rank}")
            monkeypatch.setenv("HARNESS_PATCHED", "1")
            assert settings.VALUE == f"patched by {rank}"

        @pytest.mark.distributed(world_size=2)
        def test_b_patches_and_fails(rank, monkeypatch):
            monkeypatch.setattr(settings, "VALUE", "patched again")
            assert rank == 0, "rank 1 fails on purpose"

        @pytest.mark.distributed(world_size=2)
        def test_c_sees_the_original(rank):
            assert settings.VALUE == "original"
            assert "HARNESS_PATCHED" not in os.environ
        """,
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)


def test_capture_fixtures_read_the_ranks_own_output(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import logging
        import os
        import sys
        import warnings

        import pytest

        @pytest.mark.distributed(world_size=2)
        def test_capsys(rank, capsys):
            print(f"hello from rank {rank}")
            sys.stderr.write("to stderr\\n")
            out, err = capsys.readouterr()
            assert (out, err) == (f"hello from rank {rank}\\n", "to stderr\\n")
            with capsys.disabled():
                print(f"shown as rank {rank} output")
            print("left unread")

        @pytest.mark.distributed(world_size=2)
        def test_capsysbinary(rank, capsysbinary):
            print("bytes")
            assert capsysbinary.readouterr().out == b"bytes\\n"

        @pytest.mark.distributed(world_size=2)
        def test_capfd(rank, capfd):
            os.write(1, f"fd of rank {rank}\\n".encode())
            assert capfd.readouterr().out == f"fd of rank {rank}\\n"
            with capfd.disabled():
                os.write(1, f"fd let through on rank {rank}\\n".encode())
            os.write(1, b"fd left unread\\n")
            assert capfd.readouterr() == ("fd left unread\\n", "")
            os.write(2, b"fd unread at the end\\n")

        @pytest.mark.distributed(world_size=2)
        def test_capfdbinary(rank, capfdbinary):
            os.write(2, b"raw")
            assert capfdbinary.readouterr().err == b"raw"

        @pytest.mark.distributed(world_size=2)
        def test_caplog(rank, caplog):
            caplog.set_level(logging.INFO)
            logging.getLogger("lib").info("rank %d says hi", rank)
            assert caplog.messages == [f"rank {rank} says hi"]
            assert caplog.record_tuples == [("lib", logging.INFO, f"rank {rank} says hi")]
            assert f"rank {rank} says hi" in caplog.text
            assert caplog.get_records("call") == caplog.records
            caplog.clear()
            assert caplog.records == [] and caplog.text == ""
            with caplog.at_level(logging.ERROR, logger="lib"):
                logging.getLogger("lib").warning("not recorded")
            assert logging.getLogger("lib").level == logging.NOTSET
            logging.getLogger("lib").warning("recorded")
            assert caplog.messages == ["recorded"]

        @pytest.mark.distributed(world_size=2)
        def test_recwarn(rank, recwarn):
            warnings.warn(f"careful, rank {rank}", UserWarning)
            assert len(recwarn) == 1
            assert str(recwarn.pop(UserWarning).message) == f"careful, rank {rank}"
            warnings.warn("a second", DeprecationWarning)
            assert [w.category for w in recwarn] == [DeprecationWarning]
            assert recwarn.list[0].category is DeprecationWarning
            recwarn.clear()
            assert len(recwarn) == 0
            with pytest.raises(AssertionError, match="not found"):
                recwarn.pop(UserWarning)
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=6)
    sections = dict(reports(result)["test_capsys"].sections)
    # What the test did not read, and what it let through, is that rank's captured output.
    assert "shown as rank 1 output" in sections["Captured rank 1 stdout call"]
    assert "left unread" in sections["Captured rank 0 stdout call"]
    fd_sections = dict(reports(result)["test_capfd"].sections)
    assert "fd let through on rank 1" in fd_sections["Captured rank 1 stdout call"]
    assert "fd left unread" not in fd_sections["Captured rank 1 stdout call"]
    assert "fd unread at the end" in fd_sections["Captured rank 0 stderr call"]


def test_request_is_a_view_of_the_test_in_the_rank(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        """
        [pytest]
        dist_timeout = 77
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture(params=[10, 20])
        def scaled(request, rank):
            return request.param + rank

        @pytest.fixture
        def about(request, rank):
            mark = request.node.get_closest_marker("distributed")
            return (
                request.fixturename,
                request.node.name,
                mark.kwargs,
                request.config.getini("dist_timeout"),
                request.config.getoption("verbose"),
                request.function.__name__,
                sorted(request.keywords),
            )

        @pytest.mark.distributed(world_size=2, timeout=50)
        def test_request(rank, scaled, about, request):
            assert scaled in (10 + rank, 20 + rank)
            fixturename, name, kwargs, ini, verbose, function, keywords = about
            assert fixturename == "about"
            assert name == request.node.name
            assert name.startswith("test_request[")
            assert kwargs == {"world_size": 2, "timeout": 50}
            assert ini == "77"
            assert verbose == 0
            assert function == "test_request"
            assert keywords == ["distributed"]
            assert request.config.getoption("--no-such-flag", "fallback") == "fallback"
            with pytest.raises(ValueError, match="no option named '--no-such-flag'"):
                request.config.getoption("--no-such-flag")
            with pytest.raises(ValueError, match="unknown ini option 'nope'"):
                request.config.getini("nope")
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)


def test_tmp_path_factory_in_the_ranks_is_the_sessions(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=2)
        def test_factory(rank, tmp_path_factory, tmp_path):
            assert tmp_path_factory.getbasetemp() == tmp_path.parent
            made = tmp_path_factory.mktemp("data")
            assert made.parent == tmp_path.parent and made.name.startswith("data")
            (made / "owner").write_text(str(rank))
            dist.barrier()
            made_by = sorted((p / "owner").read_text() for p in made.parent.glob("data*"))
            assert made_by == ["0", "1"]  # one directory per rank, none shared by mistake
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)


def test_a_session_directory_built_on_tmp_path_factory_is_shared(
    pytester: pytest.Pytester,
) -> None:
    # The everyday idiom: a session fixture makes one directory with tmp_path_factory; rank 0
    # saves a checkpoint there and rank 1 loads it. The fixture stays in the pytest process,
    # so every rank gets the same directory, test after test.
    pytester.makepyfile(
        """
        import os

        import pytest
        import torch
        import torch.distributed as dist

        @pytest.fixture(scope="session")
        def shared_dir(tmp_path_factory):
            return tmp_path_factory.mktemp("shared")

        @pytest.fixture
        def checkpoint(shared_dir, rank):  # rank-side: it asks for rank
            return shared_dir / "model.pt"

        @pytest.mark.distributed(world_size=2)
        def test_save_on_0_load_on_1(rank, shared_dir, checkpoint):
            assert shared_dir.name == "shared0"
            if rank == 0:
                torch.save({"w": torch.arange(4)}, checkpoint)
            dist.barrier()
            assert torch.equal(torch.load(checkpoint)["w"], torch.arange(4))

        @pytest.mark.distributed(world_size=2)
        def test_same_directory_later(rank, shared_dir, tmp_path_factory):
            # the body may still ask for the factory itself: the session's base directory
            assert shared_dir.parent == tmp_path_factory.getbasetemp()
            assert sorted(os.listdir(shared_dir)) == ["model.pt"]

        def test_in_the_controller(shared_dir):
            assert shared_dir.name == "shared0"
            assert sorted(os.listdir(shared_dir)) == ["model.pt"]
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=3)


HARNESS_FIXTURES = """
import os

import pytest
import torch.distributed as dist

import harness

LOG = os.environ["FIXTURE_LOG"]

def log(line):
    with open(LOG, "a") as handle:
        handle.write(line + "\\n")

@harness.fixture(scope="session")
def group(rank, world_size):
    log(f"session setup {rank} {os.getpid()}")
    yield dist.new_group(list(range(world_size)))
    log(f"session teardown {rank} {os.getpid()}")

@harness.fixture(scope="module")
def per_module(rank, request):
    log(f"module setup {rank} {request.node.nodeid.split('::')[0]}")
    yield rank
    log(f"module teardown {rank}")

@harness.fixture
def plain():
    return os.getpid()
"""


def test_harness_fixture_scopes_and_teardown_run_in_the_ranks(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    pytester.makeconftest(HARNESS_FIXTURES)
    pytester.makepyfile(
        test_a="""
        import os

        import pytest
        import torch
        import torch.distributed as dist

        @pytest.mark.distributed(world_size=2)
        def test_one(rank, group, per_module, plain):
            assert plain == os.getpid()  # a rank's pid: it ran there
            t = torch.ones(1)
            dist.all_reduce(t, group=group)
            assert t.item() == 2

        @pytest.mark.distributed(world_size=2)
        def test_two(rank, group, per_module):
            assert per_module == rank
            t = torch.ones(1)
            dist.all_reduce(t, group=group)  # the session's group outlives test_one
            assert t.item() == 2

        def test_not_distributed(plain):
            assert plain == os.getpid()  # an ordinary fixture here
        """,
        test_b="""
        import os

        import pytest

        @pytest.mark.distributed(world_size=2)
        def test_three(rank, group, per_module):
            with open(os.environ["FIXTURE_LOG"]) as handle:
                lines = handle.read().splitlines()
            # test_a's module fixture ended with its module, before this module's began.
            assert sorted(lines[:6]) == sorted(
                [f"session setup {r} {p}" for r, p in _pids(lines)]
                + [f"module setup {r} test_a.py" for r in (0, 1)]
                + [f"module teardown {r}" for r in (0, 1)]
            )

        def _pids(lines):
            return [
                (int(line.split()[2]), line.split()[3])
                for line in lines if line.startswith("session setup")
            ]
        """,
    )
    result = pytester.runpytest("-p", "no:randomly", f"--basetemp={tmp_path / 'base'}")
    result.assert_outcomes(passed=4)
    lines = log.read_text().splitlines()
    assert sum(line.startswith("session setup") for line in lines) == 2  # once per rank
    assert sum(line.startswith("module setup") for line in lines) == 4  # per module and rank
    assert sum(line.startswith("module teardown") for line in lines) == 4
    teardowns = [line for line in lines if line.startswith("session teardown")]
    setups = [line for line in lines if line.startswith("session setup")]
    assert sorted(t.split()[2:] for t in teardowns) == sorted(s.split()[2:] for s in setups)


def test_harness_fixture_session_scope_follows_a_rebuilt_world(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makeconftest(HARNESS_FIXTURES)
    pytester.makepyfile(
        """
        import os

        import pytest

        @pytest.mark.distributed(world_size=2)
        def test_one(rank, group):
            pass

        @pytest.mark.distributed(world_size=2)
        def test_fails(rank, group):
            assert rank == 0

        @pytest.mark.distributed(world_size=2)
        def test_after(rank, group):
            pass
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    lines = (tmp_path / "log").read_text().splitlines()
    # Set up in the first processes, in the fresh ones that confirm the failure, and again
    # in the ones the failure's rebuild started.
    assert sum(line.startswith("session setup") for line in lines) == 6


@pytest.fixture(autouse=True)
def _fixture_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FIXTURE_LOG", str(tmp_path / "log"))


def test_a_failing_rank_fixture_is_the_tests_setup_or_teardown_error(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch.distributed as dist

        import harness

        @harness.fixture
        def broken_setup(rank):
            if rank == 1:
                raise RuntimeError("cannot set up on rank 1")
            return rank

        @harness.fixture
        def broken_teardown(rank):
            yield rank
            if rank == 0:
                raise RuntimeError("cannot tear down on rank 0")

        @pytest.mark.distributed(world_size=2)
        def test_setup_fails(broken_setup):
            # Rank 0 gets here, and fails because rank 1 is gone: a consequence.
            dist.barrier()

        @pytest.mark.distributed(world_size=2)
        def test_teardown_fails(broken_teardown):
            pass

        @harness.fixture
        def skips(rank):
            pytest.skip("not here")

        @pytest.mark.distributed(world_size=2)
        def test_fixture_skips(skips):
            raise AssertionError("the body must not run")
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=1, errors=2, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_setup_fails*",
            "*- rank 1*",
            "*RuntimeError: cannot set up on rank 1*",
            "*ERROR at teardown of test_teardown_fails*",
            "*RuntimeError: cannot tear down on rank 0*",
        ]
    )
    result.stdout.no_fnmatch_line("*the body must not run*")


def test_fixtures_that_cannot_run_in_the_ranks_say_why(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        def make():
            @pytest.fixture
            def local(rank):
                return rank
            return local

        local = make()

        @pytest.mark.distributed(world_size=2)
        def test_local(local):
            pass

        @pytest.fixture
        def looks_up(request):
            return request.getfixturevalue("rank")

        @pytest.mark.distributed(world_size=2)
        def test_looks_up(looks_up):
            pass
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "*fixture 'local' must run in the ranks (it requests 'rank'), but a rank cannot "
            "import it: it is defined inside a function (make.<locals>.local)*",
            "*fixture 'rank' has a value only inside each rank: request it as an argument*",
        ]
    )


def test_harness_fixture_rejects_an_unknown_scope() -> None:
    import harness

    with pytest.raises(ValueError, match=r"scope must be one of .* not 'world'"):
        harness.fixture(scope="world")


def test_the_readmes_mesh_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import harness
        import pytest
        import torch
        from torch.distributed.device_mesh import init_device_mesh


        @harness.fixture(scope="session")
        def mesh(world_size, local_device):
            # Built once in each rank, and kept for every test of the session on that world.
            return init_device_mesh(local_device.type, (world_size,))


        @pytest.mark.distributed(world_size=2)
        def test_uses_the_mesh(mesh, rank):
            assert mesh.get_rank() == rank


        @pytest.mark.distributed(world_size=2)
        def test_uses_it_again(mesh, rank):
            import torch.distributed as dist

            t = torch.ones(1)
            dist.all_reduce(t, group=mesh.get_group())
            assert t.item() == 2
        """
    )
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=2)


def test_what_a_wider_scoped_rank_fixture_keeps_open_is_no_leak(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini(
        """
        [pytest]
        dist_leaks = error
        """
    )
    pytester.makepyfile(
        """
        import threading

        import pytest

        import harness

        @harness.fixture(scope="module")
        def service(tmp_path_factory, rank):
            stop = threading.Event()
            worker = threading.Thread(target=stop.wait, name=f"service-{rank}")
            worker.start()
            log = open(tmp_path_factory.getbasetemp() / f"service-{rank}.log", "w")
            yield log
            stop.set()
            worker.join()
            log.close()

        @pytest.mark.distributed(world_size=2)
        def test_one(service):
            service.write("one\\n")

        @pytest.mark.distributed(world_size=2)
        def test_two(service):
            service.write("two\\n")

        @pytest.mark.distributed(world_size=2)
        def test_leaks_its_own(rank):
            threading.Thread(target=threading.Event().wait, name="forgotten", daemon=True).start()
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    # The module's service lives across its tests; the test's own thread is its leak.
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*thread 'forgotten' started at*"])
