"""Every private API of torch, pytest, CPython and coverage that the harness relies on.

Nothing else in the harness touches a private name of another project. Each function below
wraps one such use and says which public API is missing; :data:`PRIVATE_APIS` lists them with
a probe each, and ``tests/test_compat.py`` runs every probe, so an upgrade that removes one
fails that test by name instead of breaking a rank in a way that is hard to trace.

Imports of torch, pytest, coverage and multiprocessing happen inside the functions: this
module is imported by the plugin (which loads into every pytest run, so it must not import
torch or multiprocessing), by ranks (which may run without pytest) and by the controller.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType, ModuleType
from typing import Any, NoReturn

__all__ = [
    "ASSERT_REWRITER_MODULE",
    "PRIVATE_APIS",
    "asserts_rewritten",
    "backend_registry",
    "bootstrapping",
    "coverage_config_file",
    "environ_bytes",
    "exempt_from_assert_rewriting",
    "fixture_defs",
    "flight_recorder_entries",
    "forget_forkserver",
    "forget_parent_multiprocessing",
    "forkserver_pid",
    "forkserver_started_by",
    "frame",
    "frame_of_thread",
    "ini_names",
    "leave_pytest_import_hook",
    "live_process_groups",
    "monkeypatch",
    "mptc_check",
    "mptc_divert",
    "mptc_error_exit_code",
    "mptc_is_case_class",
    "mptc_join_natively",
    "mptc_refresh_module_state",
    "mptc_run",
    "mptc_run_kwargs",
    "mptc_skip_codes",
    "mptc_test_name",
    "mptc_timeout",
    "mptc_trim_traceback",
    "process_group_count",
    "pytest_timeout_settings",
    "restore_backend_registry",
    "rewrite_asserts",
    "rpc_agent_running",
    "rpc_init_count",
    "skip_at_test",
    "test_argnames",
    "xfail_raises",
]


# -- torch -----------------------------------------------------------------------------------


def live_process_groups() -> set[Any]:
    """Every process group alive in this process, the default group included.

    torch has no public way to list process groups (only ``get_process_group_ranks`` of a
    group one already holds); ``distributed_c10d._world.pg_map`` is the registry that
    ``new_group`` adds to and ``destroy_process_group`` removes from.
    """
    from torch.distributed import distributed_c10d

    return set(distributed_c10d._world.pg_map)


def process_group_count() -> int:
    """How many process groups this process has created so far (its group counter).

    ``new_group`` names a group after this counter (``distributed_c10d._world.group_count``);
    ranks whose counters differ name their next group differently and cannot meet in it.
    torch offers no public way to read it.
    """
    from torch.distributed import distributed_c10d

    return int(distributed_c10d._world.group_count)


def backend_registry() -> dict[str, Any]:
    """A copy of torch.distributed's backend registry, to put back with
    :func:`restore_backend_registry`.

    torch has no way to unregister a backend. ``Backend.register_backend(name, ...)`` adds the
    name as a class attribute of ``Backend`` (``Backend.NAME``) and to the class-level
    containers ``backend_list`` (what ``is_backend_available`` reads), ``backend_type_map``,
    ``backend_capability``, ``default_device_backend_map`` and ``_plugins`` (whichever this
    torch has, 2.4 to 2.13): the copy holds every class attribute, containers copied.

    Returns:
        ``{attribute name: value}``, lists and dicts as shallow copies.
    """
    from torch.distributed import Backend

    return {
        name: (value.copy() if isinstance(value, (list, dict)) else value)
        for name, value in vars(Backend).items()
    }


def restore_backend_registry(saved: dict[str, Any]) -> None:
    """Put torch.distributed's backend registry back as :func:`backend_registry` copied it.

    Attributes added since are deleted, containers are refilled in place (other modules may
    hold them), anything else rebound. Only what differs is touched.

    Args:
        saved: What :func:`backend_registry` returned.
    """
    from torch.distributed import Backend

    now = vars(Backend)
    for name in [name for name in now if name not in saved]:
        delattr(Backend, name)
    for name, value in saved.items():
        current: Any = now.get(name)
        if isinstance(value, list) and type(current) is list:
            if current != value:
                current[:] = value
        elif isinstance(value, dict) and type(current) is dict:
            if current != value:
                current.clear()
                current.update(value)
        elif current is not value:
            setattr(Backend, name, value.copy() if isinstance(value, (list, dict)) else value)


def rpc_init_count() -> int:
    """How many times this process has initialized ``torch.distributed.rpc`` (0 where that
    module was never imported).

    ``init_rpc`` counts its initializations in ``torch.distributed.rpc._init_counter`` (it
    prefixes each one's store with it); torch says nowhere else whether RPC was ever used.
    """
    rpc: Any = sys.modules.get("torch.distributed.rpc")
    return int(getattr(rpc, "_init_counter", 0)) if rpc is not None else 0


def rpc_agent_running() -> bool:
    """Whether an RPC agent is set in this process (``init_rpc`` without ``shutdown``).

    ``torch.distributed.rpc._is_current_rpc_agent_set`` (from ``torch._C``); there is no
    public ``is_initialized`` for RPC.
    """
    rpc: Any = sys.modules.get("torch.distributed.rpc")
    is_set = getattr(rpc, "_is_current_rpc_agent_set", None) if rpc is not None else None
    return bool(is_set()) if is_set is not None else False


# -- torch's private test API (torch.testing._internal) --------------------------------------
#
# torch's ``MultiProcessTestCase`` lives in ``torch.testing._internal.common_distributed``:
# private, but it is what many distributed test suites are written on, and ``--dist-mptc``
# runs them unchanged. Nothing else in the harness names that module or the attributes below.

MPTC_MODULE = "torch.testing._internal.common_distributed"
"""The module of ``MultiProcessTestCase``."""

_DISTRIBUTED_TEST_MODULE = "torch.testing._internal.distributed.distributed_test"


def mptc_is_case_class(cls: object) -> bool:
    """Whether ``cls`` is a ``MultiProcessTestCase`` class (torch's, or a subclass of it).

    Looked up in ``sys.modules`` only: a class derived from it can exist only once its module
    was imported, so a session without such tests never imports it (nor torch).
    """
    module = sys.modules.get(MPTC_MODULE)
    base = getattr(module, "MultiProcessTestCase", None)
    return isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base)


def mptc_test_name(case: Any) -> str:
    """The name the case's processes are told to run (``_current_test_name()``, the last
    part of ``case.id()``)."""
    return str(case._current_test_name())


def mptc_timeout(case: Any) -> float:
    """The class's own time limit for one test (``common_distributed.get_timeout(id)``:
    ``TIMEOUT_OVERRIDE`` or ``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT``, 300 s by default)."""
    module = sys.modules[MPTC_MODULE]
    return float(module.get_timeout(case.id()))


def mptc_run_kwargs(case: Any) -> dict[str, Any]:
    """The keyword arguments ``_start_processes`` gives each process's ``cls._run``: its
    ``fake_pg`` where ``_run`` takes keyword arguments (newer torch); none in older torch,
    whose ``_run(rank, test_name, file_name, parent_pipe)`` takes none."""
    import inspect

    parameters = inspect.signature(type(case)._run).parameters.values()
    if any(p.kind is p.VAR_KEYWORD or p.name == "fake_pg" for p in parameters):
        return {"fake_pg": getattr(case, "fake_pg", False)}
    return {}


def mptc_error_exit_code() -> int:
    """The exit code of a process whose test raised (``TEST_ERROR_EXIT_CODE``, 10); its
    traceback then went through the parent pipe."""
    module = sys.modules[MPTC_MODULE]
    return int(module.MultiProcessTestCase.TEST_ERROR_EXIT_CODE)


def mptc_skip_codes() -> dict[int, str]:
    """The exit codes that mean "skipped" (``TEST_SKIPS``), with their messages."""
    module = sys.modules[MPTC_MODULE]
    return {skip.exit_code: skip.message for skip in module.TEST_SKIPS.values()}


def mptc_divert(case: Any, start: Callable[[Any], None], join: Callable[[Any], None]) -> None:
    """Have this test case instance call ``start(proc)`` where it would start its processes
    (``_start_processes``, what ``_spawn_processes`` and ``setUp`` lead to) and ``join(fn)``
    where it would wait for them (``_join_processes``, called by the test method's wrapper).

    Set on the instance, so a subclass's own ``_spawn_processes`` or ``setUp`` still runs;
    ``cls._run`` (what each process runs) is untouched.
    """
    case._start_processes = start
    case._join_processes = join


def mptc_join_natively(case: Any, fn: Any) -> None:
    """The class's own ``_join_processes(fn)`` (for a test whose ``setUp`` started none)."""
    type(case)._join_processes(case, fn)


def mptc_check(
    case: Any, fn: Any, elapsed: float, processes: list[Any], pipes: dict[int, Any]
) -> None:
    """The class's own verdict on its processes' exit codes (``_check_return_codes``).

    Args:
        case: The test case instance in the controller.
        fn: The test method, as ``_join_processes`` received it.
        elapsed: Seconds the processes ran.
        processes: By rank, objects with ``exitcode`` and ``pid`` (``case.processes``).
        pipes: By pid, objects whose ``recv()`` returns what that rank sent through its
            pipe (``case.pid_to_pipe``).

    Raises:
        unittest.SkipTest: The first rank exited with a ``TEST_SKIPS`` code.
        Exception: The class's failure (``RuntimeError`` naming the ranks that raised,
            ``AssertionError`` for an unexpected exit code).
    """
    case.processes = processes
    case.pid_to_pipe = pipes
    case._check_return_codes(fn, elapsed)


def mptc_run(
    cls: Any, rank: int, test_name: str, file_name: str, pipe: Any, kwargs: dict[str, Any]
) -> None:
    """What each of a test's processes runs: ``cls._run(rank, test_name, file_name, pipe)``."""
    cls._run(rank, test_name, file_name, pipe, **kwargs)


def mptc_refresh_module_state() -> None:
    """Put back what a fresh process of a test would have read when it imported torch's
    test modules, where a reused rank keeps what an earlier test's environment said.

    ``distributed_test`` reads ``INIT_METHOD`` and ``BACKEND`` from the environment when it
    is imported (a reused rank would keep a rendezvous file that an earlier test deleted,
    and a ``FileStore`` retries a missing file silently until its timeout), and counts its
    file barriers in ``Barrier.barrier_id`` from 0 in every new process.
    """
    module: Any = sys.modules.get(_DISTRIBUTED_TEST_MODULE)
    if module is None:
        return
    module.INIT_METHOD = os.getenv("INIT_METHOD", "env://")
    if "BACKEND" in os.environ:
        module.BACKEND = os.environ["BACKEND"]
    module.Barrier.barrier_id = 0


def mptc_trim_traceback(tb: Any) -> Any:
    """A test's traceback without the leading frames of torch's process runner
    (``run_test`` and the method wrapper in ``common_distributed``): the test comes first."""
    module = sys.modules.get(MPTC_MODULE)
    runner = getattr(module, "__file__", None)
    start = tb
    while tb is not None and tb.tb_frame.f_code.co_filename == runner:
        tb = tb.tb_next
    return tb if tb is not None else start


# -- CPython ---------------------------------------------------------------------------------


def frame(depth: int) -> FrameType | None:
    """The frame ``depth`` calls above the caller (0: the caller's own), None past the
    outermost. Private: ``sys._getframe``; ``inspect.stack()`` formats every frame
    (milliseconds), far too slow for a call site taken at every collective."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None


def frame_of_thread(ident: int) -> FrameType | None:
    """The frame a thread is running now (another thread's too, while it is blocked in C),
    or None. Private: ``sys._current_frames``; ``faulthandler`` writes text, not frames."""
    return sys._current_frames().get(ident)


FLIGHT_RECORDER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""The variables that turn torch's flight recorder on (set before the process group is made)."""


def flight_recorder_entries() -> list[dict[str, Any]]:
    """What torch's flight recorder holds of this process's collectives, oldest first; empty
    where it is off (none of ``FLIGHT_RECORDER_VARIABLES`` set) or this torch has none.

    Private: ``torch._C._distributed_c10d._dump_fr_trace`` (Gloo and others; torch 2.13
    records Gloo, including the all-reduces DDP issues from C++) and ``_dump_nccl_trace``
    (NCCL, CUDA builds only; untested here: no GPU), each a pickled dict whose
    ``"entries"`` hold ``pg_id``, ``collective_seq_id``, ``profiling_name``
    (``"gloo:all_reduce"``), ``input_sizes``, ``input_dtypes``, ``state``, ``frames`` and
    ``time_created_ns`` (wall clock). torch has no public API for it.
    """
    if not any(os.environ.get(name, "0") not in ("", "0") for name in FLIGHT_RECORDER_VARIABLES):
        return []
    import importlib
    import pickle

    try:
        c10d = importlib.import_module("torch._C._distributed_c10d")
    except ImportError:
        return []  # torch built without distributed
    entries: dict[tuple[Any, ...], dict[str, Any]] = {}
    for name in ("_dump_fr_trace", "_dump_nccl_trace"):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            data = pickle.loads(dump(True, True, False))
        except Exception:
            continue  # the recorder of that backend is not set up in this process
        for entry in data.get("entries", []) if isinstance(data, dict) else []:
            key = (entry.get("pg_id"), entry.get("record_id"), entry.get("profiling_name"))
            entries.setdefault(key, entry)
    return sorted(entries.values(), key=lambda entry: entry.get("time_created_ns", 0))


def forkserver_pid() -> int | None:
    """The pid of this process's multiprocessing forkserver, or None when none runs.

    ``multiprocessing.forkserver`` documents no way to reach the server process; its pid is
    ``_forkserver._forkserver_pid``.
    """
    import multiprocessing.forkserver

    server = multiprocessing.forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


def forget_forkserver() -> None:
    """Close this process's side of the forkserver and forget it (after it was killed).

    There is no public way to stop a forkserver; ``_forkserver._stop()`` closes our socket
    and reaps the server so that multiprocessing does not try to use it again.
    """
    import multiprocessing.forkserver

    multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]


@contextlib.contextmanager
def forkserver_started_by(start: Callable[[str, Sequence[int]], int | None]) -> Iterator[None]:
    """While inside, multiprocessing starts its forkserver through ``start(command, fds)``.

    ``start`` returns the pid of a child of this process that runs the Python source
    ``command`` (what multiprocessing would run as ``python -c command``) holding the file
    descriptors ``fds``, or None to have multiprocessing start the new interpreter itself.
    Other processes multiprocessing starts meanwhile (its resource tracker) start as usual.

    multiprocessing has no way to choose how the server process is made: it calls
    ``multiprocessing.util.spawnv_passfds``, which this replaces for the duration.
    """
    import multiprocessing.forkserver
    import multiprocessing.util

    util: Any = multiprocessing.util
    spawnv_passfds = util.spawnv_passfds

    def spawn(path: str, args: Sequence[str], passfds: Sequence[int]) -> int:
        command = args[-1]
        pid = None
        if len(args) >= 2 and args[-2] == "-c" and "multiprocessing.forkserver" in command:
            pid = start(command, passfds)
        return spawnv_passfds(path, args, passfds) if pid is None else pid

    util.spawnv_passfds = spawn
    try:
        yield
    finally:
        util.spawnv_passfds = spawnv_passfds


def forget_parent_multiprocessing() -> None:
    """In a fork that is to serve as a forkserver: forget the parent's forkserver and
    resource tracker, as a new interpreter would not know them.

    The fork is made while the parent holds the forkserver's lock and knows its own
    resource tracker's pid; left as they are, a rank that starts processes of its own would
    wait for that lock forever. Each object gets the state of a new one
    (``multiprocessing.forkserver._forkserver``, ``resource_tracker._resource_tracker``):
    the module-level functions are bound to these very objects, so they cannot be replaced.
    """
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    for module, name in (
        (multiprocessing.forkserver, "_forkserver"),
        (multiprocessing.resource_tracker, "_resource_tracker"),
    ):
        obj = getattr(module, name)
        obj.__dict__.clear()
        obj.__dict__.update(type(obj)().__dict__)


def bootstrapping() -> bool:
    """Whether this process is a multiprocessing child still importing its parent's main
    module (spawn and forkserver re-run it, as ``__mp_main__``, before the child's target).

    multiprocessing checks this through the private ``current_process()._inheriting`` and
    then raises a long generic error; the harness checks first to say what to do instead.
    """
    import multiprocessing

    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


# -- coverage --------------------------------------------------------------------------------


def coverage_config_file(cov: Any) -> str | bool:
    """The configuration file a ``coverage.Coverage`` read, or False when it read none.

    ``Coverage.get_option`` reads every setting but not which file they came from; ranks
    read the same file so that settings we do not copy (plugins, ``[paths]``) still apply.
    """
    path = cov.config.config_file
    return path if isinstance(path, str) and path else False


def environ_bytes() -> Mapping[bytes, bytes]:
    """The live ``os.environ`` as the bytes mapping it keeps (read it, never write it).

    Comparing or copying ``os.environ`` goes through its Mapping methods, decoding every key
    and value: ~1 µs per variable, paid by every rank at every call to put the environment
    back. ``os.environ._data`` is the dict of bytes those methods read, copied and compared
    at C speed; there is no public equivalent.
    """
    data: Mapping[bytes, bytes] = os.environ._data  # type: ignore[attr-defined]
    return data


# -- pytest ----------------------------------------------------------------------------------


def skip_at_test(reason: str) -> NoReturn:
    """Raise pytest's skip so that the report points at the test, not at the harness.

    ``pytest.skip()`` raised from a hook is reported at the hook's line; pytest's own
    ``skipif`` marks use the private ``_use_item_location=True`` to place it at the test
    item, and there is no public equivalent.
    """
    import pytest

    raise pytest.skip.Exception(reason, _use_item_location=True)


def test_argnames(item: Any) -> tuple[str, ...]:
    """The names of the arguments a test function takes (not the fixtures pulled in only by
    other fixtures or ``autouse``).

    pytest's own ``pytest_pyfunc_call`` reads ``item._fixtureinfo.argnames``; the public
    ``item.fixturenames`` also holds fixtures the function does not take.
    """
    return tuple(item._fixtureinfo.argnames)


def fixture_defs(item: Any) -> Mapping[str, Sequence[Any]]:
    """Every fixture definition a test can see, by name: ``pytest.FixtureDef`` lists, the one
    the test uses last (earlier ones are what an overriding fixture of the same name gets).

    pytest computes this closure when it collects the test and keeps it in
    ``item._fixtureinfo.name2fixturedefs``; no public API gives the definitions behind
    ``item.fixturenames``, and the plugin must know, before pytest sets any fixture up,
    which of them run in the ranks.
    """
    defs: Mapping[str, Sequence[Any]] = item._fixtureinfo.name2fixturedefs
    return defs


def ini_names(config: Any) -> list[str]:
    """The names of every registered ini option, for ``request.config.getini`` in a rank.

    ``config.getini`` reads one name at a time and pytest has no public list of the names.
    """
    return list(config._parser._inidict)


def monkeypatch() -> Any:
    """A new ``pytest.MonkeyPatch`` (public; here because the rank side reaches pytest only
    through this module, and imports it only when a test asks for ``monkeypatch``)."""
    import pytest

    return pytest.MonkeyPatch()


def xfail_raises(item: Any) -> tuple[tuple[Any, ...], str] | None:
    """``(raises, reason)`` of the ``xfail`` mark that applies to the item, or None.

    pytest evaluates xfail conditions once and keeps the result in
    ``item.stash[_pytest.skipping.xfailed_key]``; reading the mark ourselves would mean
    evaluating its conditions a second time. None also when the mark has no ``raises``.
    """
    from _pytest.skipping import xfailed_key

    xfailed = item.stash.get(xfailed_key, None)
    if xfailed is None or xfailed.raises is None:
        return None
    raises = xfailed.raises if isinstance(xfailed.raises, tuple) else (xfailed.raises,)
    return tuple(raises), str(xfailed.reason or "")


def pytest_timeout_settings(item: Any) -> Any:
    """pytest-timeout's settings for a test (``timeout``, ``method``, ``func_only``, ...), or
    None when pytest-timeout is not active.

    pytest-timeout resolves the marker, ``--timeout``, ``PYTEST_TIMEOUT`` and ini ``timeout``
    in its private ``_get_item_settings``. Its public hook ``pytest_timeout_set_timer`` hands
    the settings over when it arms its timer, which is enough at the start of a test; under
    ``func_only`` it arms the timer only in the call phase, after the harness ran the ranks
    (in the setup phase), so the settings are read here first.
    """
    plugin = item.config.pluginmanager.get_plugin("timeout")
    if plugin is None:
        return None
    return plugin._get_item_settings(item)


ASSERT_REWRITER_MODULE = "_pytest.assertion.rewrite"
"""The module :func:`rewrite_asserts` imports (the forkserver preloads it under pytest)."""


def rewrite_asserts(tree: Any, source: bytes, path: str) -> None:
    """Apply pytest's assertion rewriting to a parsed module, in place.

    A rank imports a test module itself; to explain a failing ``assert`` as pytest does, it
    needs pytest's rewriter, which pytest only exposes through its import hook.
    """
    import importlib

    importlib.import_module(ASSERT_REWRITER_MODULE).rewrite_asserts(tree, source, path)


def _rewrite_hooks() -> list[Any]:
    """pytest's assertion-rewriting import hooks installed in this process (one per config)."""
    return [f for f in sys.meta_path if type(f).__module__ == ASSERT_REWRITER_MODULE]


def exempt_from_assert_rewriting(*packages: str) -> None:
    """Have pytest's import hook leave the modules of these packages imported from now on.

    pytest rewrites the asserts of every module of a distribution that registers a pytest
    plugin, fhelium's included, and caches the result beside the module. Where it cannot
    write there (a read-only install; ``PYTHONDONTWRITEBYTECODE``, set in many containers),
    it parsed, rewrote and compiled the harness's modules again in every run: ~0.1 s
    before the first distributed test. Their asserts state invariants, not test outcomes,
    so they gain nothing from it. pytest can mark names (``register_assert_rewrite``), not
    unmark them: the hook keeps them in ``_must_rewrite`` and caches lookups in
    ``_marked_for_rewrite_cache``.
    """
    for hook in _rewrite_hooks():
        marked = hook._must_rewrite
        marked.difference_update([name for name in marked if name.split(".")[0] in packages])
        hook._marked_for_rewrite_cache.clear()


def leave_pytest_import_hook() -> None:
    """Remove pytest's assertion-rewriting import hooks from this process (a fork of the
    pytest process that is to serve as a forkserver, where ranks import test modules
    their own way, as they do from a new interpreter)."""
    for hook in _rewrite_hooks():
        sys.meta_path.remove(hook)


def asserts_rewritten(module: ModuleType) -> bool:
    """Whether pytest rewrote the asserts of an imported module.

    The rewriter adds ``@py_builtins`` to the module's globals; pytest has no public flag.
    """
    return hasattr(module, "@py_builtins")


# -- the inventory ---------------------------------------------------------------------------


def _probe_pg_map() -> object:
    from torch.distributed import distributed_c10d

    return distributed_c10d._world.pg_map


def _probe_group_count() -> object:
    return process_group_count()


def _probe_backend_registry() -> object:
    import warnings

    import torch.distributed as dist

    saved = backend_registry()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist.Backend.register_backend("harnessprobe", lambda *args: None, devices=["cpu"])
    try:
        if not dist.is_backend_available("harnessprobe"):
            raise AttributeError("Backend.register_backend no longer makes a backend available")
    finally:
        restore_backend_registry(saved)
    if dist.is_backend_available("harnessprobe") or hasattr(dist.Backend, "HARNESSPROBE"):
        raise AttributeError("torch keeps its backend registry outside Backend's attributes")
    return saved


def _probe_rpc_state() -> object:
    import importlib

    rpc = importlib.import_module("torch.distributed.rpc")
    if not isinstance(getattr(rpc, "_init_counter", None), int):
        raise AttributeError("torch.distributed.rpc no longer counts its inits in _init_counter")
    if rpc.is_available() and rpc_agent_running():
        raise AttributeError("_is_current_rpc_agent_set() says an agent runs where none was set")
    return rpc_init_count()


def _probe_forkserver() -> object:
    import multiprocessing.forkserver

    server: Any = multiprocessing.forkserver._forkserver
    return (server._forkserver_pid if hasattr(server, "_forkserver_pid") else None, server._stop)


def _probe_forkserver_start() -> object:
    import inspect
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker
    import multiprocessing.util

    util: Any = multiprocessing.util
    source = inspect.getsource(multiprocessing.forkserver.ForkServer.ensure_running)
    if "util.spawnv_passfds(" not in source or "'-c'" not in source:
        raise AttributeError("the forkserver is no longer started by util.spawnv_passfds -c")
    fresh = (
        multiprocessing.forkserver.ForkServer().__dict__,
        multiprocessing.resource_tracker.ResourceTracker().__dict__,
    )
    return util.spawnv_passfds, fresh


def _probe_rewrite_hook() -> object:
    from _pytest.assertion.rewrite import AssertionRewritingHook

    class Config:
        def getini(self, name: str) -> object:
            raise ValueError(name)

    hook: Any = AssertionRewritingHook(Config())  # type: ignore[arg-type]
    if type(hook).__module__ != ASSERT_REWRITER_MODULE:
        raise AttributeError(f"pytest's import hook moved to {type(hook).__module__}")
    hook.mark_rewrite("harness_probe")
    marked, cache = hook._must_rewrite, hook._marked_for_rewrite_cache
    if "harness_probe" not in marked or not isinstance(cache, dict):
        raise AttributeError("pytest's import hook keeps its marked names elsewhere")
    return marked, cache


def _probe_inheriting() -> object:
    import inspect
    import multiprocessing.spawn

    spawn: Any = multiprocessing.spawn
    source = inspect.getsource(spawn._check_not_importing_main)
    if "_inheriting" not in source:
        raise AttributeError("multiprocessing no longer flags bootstrapping with '_inheriting'")
    return source


def _probe_environ_bytes() -> object:
    data = environ_bytes()
    if not isinstance(data, dict) or (data and not isinstance(next(iter(data)), bytes)):
        raise TypeError("os.environ._data is no longer a dict of bytes")
    return data


def _probe_coverage_config() -> object:
    import coverage

    return coverage.Coverage(config_file=False).config.config_file


def _probe_use_item_location() -> object:
    import pytest

    return pytest.skip.Exception("probe", _use_item_location=True)


def _probe_xfailed_key() -> object:
    from _pytest.skipping import xfailed_key

    return xfailed_key


def _probe_rewrite() -> object:
    import ast

    tree = ast.parse("assert 1")
    rewrite_asserts(tree, b"assert 1", "<probe>")
    return tree


def _probe_fixtureinfo() -> object:
    from _pytest.fixtures import FuncFixtureInfo

    return FuncFixtureInfo.__dataclass_fields__["argnames"]


def _probe_name2fixturedefs() -> object:
    from _pytest.fixtures import FuncFixtureInfo

    return FuncFixtureInfo.__dataclass_fields__["name2fixturedefs"]


def _probe_inidict() -> object:
    import pytest

    parser = pytest.Parser(_ispytest=True)
    parser.addini("harness_probe", "probe")
    return parser._inidict["harness_probe"]


def _probe_py_builtins() -> object:
    import ast

    tree = ast.parse("assert 1")
    rewrite_asserts(tree, b"assert 1", "<probe>")
    names = {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    if "@py_builtins" not in names:
        raise AttributeError("pytest's rewriter no longer binds '@py_builtins'")
    return names


def _probe_pytest_timeout() -> object:
    import importlib

    getter = importlib.import_module("pytest_timeout")._get_item_settings
    if not callable(getter):
        raise TypeError("pytest_timeout._get_item_settings is no longer a function")
    return getter


def _probe_frames() -> object:
    import threading

    here = frame(0)
    if here is None or here.f_code.co_name != "_probe_frames":
        raise AttributeError("sys._getframe no longer returns the caller's frame")
    if frame_of_thread(threading.get_ident()) is None:
        raise AttributeError("sys._current_frames no longer lists this thread")
    return here


def _probe_flight_recorder() -> object:
    import pickle

    import torch._C._distributed_c10d as c10d

    for name in ("_dump_fr_trace", "_dump_nccl_trace"):
        dump = getattr(c10d, name, None)
        if dump is not None:
            data = pickle.loads(dump(True, True, False))
            if not isinstance(data, dict) or "entries" not in data:
                raise TypeError(f"{name} no longer returns a dict with 'entries'")
            return data
    return None  # a torch without a flight recorder: flight_recorder_entries() is empty


def _probe_mptc() -> object:
    import importlib
    import inspect

    module = importlib.import_module(MPTC_MODULE)
    cls = module.MultiProcessTestCase
    names = ("_run", "_start_processes", "_join_processes", "_check_return_codes")
    for name in (*names, "_current_test_name", "TEST_ERROR_EXIT_CODE"):
        getattr(cls, name)
    if len(inspect.signature(cls._run).parameters) < 4:
        raise TypeError(
            "MultiProcessTestCase._run no longer takes (rank, test_name, file_name, pipe)"
        )
    return (module.get_timeout, module.TEST_SKIPS)


def _probe_distributed_test_state() -> object:
    # Read, not imported: importing it needs BACKEND and WORLD_SIZE in the environment.
    import importlib.util

    spec = importlib.util.find_spec(_DISTRIBUTED_TEST_MODULE)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module {_DISTRIBUTED_TEST_MODULE}")
    with open(spec.origin) as handle:
        source = handle.read()
    for text in ('INIT_METHOD = os.getenv("INIT_METHOD"', "class Barrier", "barrier_id = 0"):
        if text not in source:
            raise AttributeError(f"distributed_test no longer has {text!r}")
    return spec.origin


PRIVATE_APIS: dict[str, Callable[[], object]] = {
    "torch.distributed.distributed_c10d._world.pg_map": _probe_pg_map,
    "torch.distributed.distributed_c10d._world.group_count": _probe_group_count,
    "torch.distributed.Backend's registry (class attributes; backend_list, _plugins, ...)": (
        _probe_backend_registry
    ),
    "torch.distributed.rpc._init_counter, _is_current_rpc_agent_set": _probe_rpc_state,
    "multiprocessing.forkserver._forkserver (._forkserver_pid, ._stop)": _probe_forkserver,
    "multiprocessing.util.spawnv_passfds starts the forkserver; ForkServer(), "
    "ResourceTracker() as new": _probe_forkserver_start,
    "multiprocessing.current_process()._inheriting": _probe_inheriting,
    "os.environ._data (the bytes behind os.environ)": _probe_environ_bytes,
    "coverage.Coverage.config.config_file": _probe_coverage_config,
    "pytest.skip.Exception(_use_item_location=True)": _probe_use_item_location,
    "_pytest.skipping.xfailed_key": _probe_xfailed_key,
    "_pytest.fixtures.FuncFixtureInfo.argnames (item._fixtureinfo)": _probe_fixtureinfo,
    "_pytest.fixtures.FuncFixtureInfo.name2fixturedefs (item._fixtureinfo)": (
        _probe_name2fixturedefs
    ),
    "pytest.Config._parser._inidict": _probe_inidict,
    "_pytest.assertion.rewrite.rewrite_asserts": _probe_rewrite,
    "_pytest.assertion.rewrite.AssertionRewritingHook (._must_rewrite, "
    "._marked_for_rewrite_cache)": _probe_rewrite_hook,
    "the '@py_builtins' global of a rewritten module": _probe_py_builtins,
    "pytest_timeout._get_item_settings (pytest-timeout)": _probe_pytest_timeout,
    "torch._C._distributed_c10d._dump_fr_trace / _dump_nccl_trace": _probe_flight_recorder,
    "sys._getframe, sys._current_frames": _probe_frames,
    "torch.testing._internal.common_distributed.MultiProcessTestCase "
    "(_run, _start_processes, _join_processes, _check_return_codes, TEST_SKIPS)": _probe_mptc,
    "torch.testing._internal.distributed.distributed_test (INIT_METHOD, BACKEND, "
    "Barrier.barrier_id)": _probe_distributed_test_state,
}
"""Each private API above, named as a reader would look it up, with a probe that raises
(AttributeError, ImportError, TypeError, ...) when an upgrade has removed it."""
