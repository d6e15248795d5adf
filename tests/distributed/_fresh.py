"""Run a test function in a fresh process, alone or as the ranks of a real process group.

``run(func, ...)`` runs the module-level function ``func`` in a child process and returns
what it returned; ``run_world(func, world_size, ...)`` runs ``func(rank, world_size, ...)``
in ``world_size`` children at once and returns their results in rank order. If a child
raises, the test fails with a :class:`ChildFailed` that carries the child's exception type,
message, formatted traceback and the tail of its output; if a child does not finish within
``timeout`` seconds, every child of the call is killed and the test fails. Every child is
killed if still alive and always joined before ``run``/``run_world`` returns, so none is left
behind, whatever happens in the parent (a failure, a timeout, ``KeyboardInterrupt``).

Why a child is as good as a fresh interpreter
---------------------------------------------
The children come from ``multiprocessing.get_context("forkserver")``. The fork server is
*not* a fork of the pytest process: multiprocessing starts it with ``exec`` as a brand-new
interpreter, and the only modules it imports are its preload list, ``torch`` and
``torch.distributed`` (plus ``sys.path``, copied from the parent so that test modules can be
imported by name). Importing them creates no process group, no store and no CUDA context:
``torch.distributed``'s global state (the default group, the group maps) is module-level
state that starts out empty, and CUDA is initialized lazily on first use. Each child is a
``fork`` of that untouched server, so it starts with exactly the state that
``python -c "import torch, torch.distributed"`` has, and nothing that an earlier child or
the pytest process did (initializing a group, a failed rendezvous, a warning filter) can
leak into it. The preload only saves the import time. Unlike a plain multiprocessing
child, it does not re-import the parent's ``__main__`` either (see
:func:`_main_module_left_out`). The fork server is one per process: where other code of the
same pytest process started it first with a longer preload list, children also have those
modules imported, which still creates no distributed state.

Before the test function is imported and run, the child removes every variable that a
launcher such as torchrun sets (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` ...,
see :data:`LAUNCHER_ENV`) and applies the ``env`` it was given (``None`` as a value unsets a
variable). torch reads these variables when ``init_process_group`` or CUDA initialization
runs, not when it is imported, so setting them in the child is the same as setting them
before starting an interpreter. Unless ``cuda=True``, the child also sets
``CUDA_VISIBLE_DEVICES=""`` (CUDA is initialized only after that, in the child) and checks
that ``torch.cuda.is_available()`` is then False: the CPU contract is tested the same way on
a machine with GPUs.

A child ends with ``os._exit`` (multiprocessing's way), so no ``atexit`` handler of torch
runs after the test function; a process group that a test leaves alive dies with its process.

Test functions must be module-level functions of an importable module (the modules of this
directory are importable by name: pytest puts the directory on ``sys.path``). They live in
the ``_*_children.py`` modules, which do not import pytest, so that a child starts in about
a tenth of a second. Inside a child, ``assert`` statements are *not* rewritten by pytest, so
child functions return what they observed (see :func:`capture` and :func:`dist_state`) and
the test asserts on it in the parent; ``pytest.skip`` in a child skips the test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import importlib
import multiprocessing
import multiprocessing.connection
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing import spawn
from typing import Any

#: Seconds a child may run before it is killed and the test fails.
DEFAULT_TIMEOUT = 60.0

#: Modules the fork server imports once, so that each child starts with them loaded.
PRELOAD = ["torch", "torch.distributed"]

#: Variables a launcher (torchrun, SLURM wrappers, an earlier test) may have left in the
#: environment; each child starts without them, then gets the ``env`` of its call.
LAUNCHER_ENV = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCH_DIST_INIT_BARRIER",
)
LAUNCHER_ENV_PREFIXES = ("TORCHELASTIC_",)

_OUTPUT_TAIL = 6000


class ChildFailed(AssertionError):
    """A child process raised, crashed or timed out; the message says which and shows why."""

    def __init__(
        self,
        summary: str,
        *,
        rank: int | None = None,
        type_name: str | None = None,
        message: str = "",
        traceback_text: str = "",
        output: str = "",
    ) -> None:
        self.rank = rank
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text
        self.output = output
        parts = [summary]
        if traceback_text:
            parts.append("--- child traceback ---\n" + traceback_text.rstrip())
        if output.strip():
            parts.append("--- child output (tail) ---\n" + output[-_OUTPUT_TAIL:].rstrip())
        super().__init__("\n".join(parts))


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a call did in a child: returned a value, or raised (type, message, cause)."""

    value: Any = None
    exc_type: str | None = None
    exc_mro: tuple[str, ...] = ()
    message: str = ""
    cause_type: str | None = None
    cause_message: str = ""
    elapsed: float = 0.0

    @property
    def raised(self) -> bool:
        return self.exc_type is not None

    def is_a(self, name: str) -> bool:
        """True when the exception is an instance of the builtin class called ``name``."""
        return name in self.exc_mro


_KEPT: list[Any] = []


def kept(obj: Any) -> Any:
    """Keep ``obj`` (a tensor given to a collective) alive until the child exits.

    With torch 2.4, destroying a Gloo process group can deadlock: the destructor joins the
    Gloo worker threads while holding the GIL, and a worker that is still dropping the last
    reference to a finished collective's tensor needs the GIL to free the tensor's Python
    object. A tensor that Python still holds is not freed by the worker, so a child keeps
    the tensors of its collectives until it exits (which skips all clean-up: ``os._exit``).
    Newer releases release the GIL in that destructor.
    """
    _KEPT.append(obj)
    return obj


def capture(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Outcome:
    """Call ``func`` (in a child) and describe what happened as a picklable :class:`Outcome`."""
    start = time.monotonic()
    try:
        value = func(*args, **kwargs)
    except Exception as exc:
        cause = exc.__cause__
        return Outcome(
            exc_type=type(exc).__name__,
            exc_mro=tuple(c.__name__ for c in type(exc).__mro__),
            message=str(exc),
            cause_type=None if cause is None else type(cause).__name__,
            cause_message="" if cause is None else str(cause),
            elapsed=time.monotonic() - start,
        )
    return Outcome(value=value, elapsed=time.monotonic() - start)


def dist_state() -> dict[str, Any]:
    """Describe the default process group of this process (call it in a child)."""
    import torch.distributed as dist

    state: dict[str, Any] = {"initialized": dist.is_initialized()}
    if state["initialized"]:
        c10d = dist.distributed_c10d
        underlying = c10d._get_default_store()
        while isinstance(underlying, dist.PrefixStore):  # PyTorch's own key-prefix wrappers
            underlying = underlying.underlying_store
        state.update(
            backend=str(dist.get_backend()),
            world_size=dist.get_world_size(),
            rank=dist.get_rank(),
            store=type(underlying).__name__,
            group_count=len(c10d._world.pg_map),
        )
    return state


def run(
    func: Callable[..., Any],
    /,
    *args: Any,
    env: Mapping[str, str | None] | None = None,
    cuda: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    **kwargs: Any,
) -> Any:
    """Run ``func(*args, **kwargs)`` in a fresh process and return its return value."""
    return _run_all(func, [(args, env)], kwargs, cuda=cuda, timeout=timeout)[0]


def run_world(
    func: Callable[..., Any],
    world_size: int,
    /,
    *args: Any,
    env: Mapping[str, str | None] | None = None,
    rank_env: Callable[[int], Mapping[str, str | None]] | None = None,
    ranks: Sequence[int] | None = None,
    cuda: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    **kwargs: Any,
) -> list[Any]:
    """Run ``func(rank, world_size, *args, **kwargs)`` for each rank, all at once.

    Each rank is its own fresh process. ``ranks`` starts only some of them (to leave a rank
    out of a rendezvous); the results are returned in the order of ``ranks``. ``env`` applies
    to every rank, ``rank_env(rank)`` adds per-rank variables. The first child to fail makes
    the call kill the others and raise.
    """
    chosen = list(range(world_size)) if ranks is None else list(ranks)
    jobs = []
    for rank in chosen:
        merged: dict[str, str | None] = dict(env or {})
        if rank_env is not None:
            merged.update(rank_env(rank))
        jobs.append(((rank, world_size, *args), merged))
    return _run_all(func, jobs, kwargs, cuda=cuda, timeout=timeout, labels=chosen)


def _context() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


@contextlib.contextmanager
def _main_module_left_out() -> Iterator[None]:
    """Start children that do not re-import the parent's ``__main__``.

    multiprocessing makes a forkserver child import the parent's main module first (the
    ``pytest`` console script, say): something a fresh interpreter running a test function
    would not do. The test functions live in importable modules, so the child needs none of
    it; dropping it from the preparation data also saves an import of pytest per child.
    """
    original = spawn.get_preparation_data

    def without_main(name: str) -> dict[str, Any]:
        data: dict[str, Any] = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        spawn.get_preparation_data = original


def _reference(func: Callable[..., Any]) -> tuple[str, str]:
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname or "." in qualname:
        raise TypeError(
            f"{func!r} cannot run in a child process: it must be a module-level function "
            "of an importable module"
        )
    return module, qualname


def _run_all(
    func: Callable[..., Any],
    jobs: list[tuple[tuple[Any, ...], Mapping[str, str | None] | None]],
    kwargs: dict[str, Any],
    *,
    cuda: bool,
    timeout: float,
    labels: Sequence[int] | None = None,
) -> list[Any]:
    module, qualname = _reference(func)
    ctx = _context()
    names = [f"rank {label}" for label in labels] if labels is not None else ["child"]
    procs: list[Any] = []
    conns: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="fresh-") as tmp:
        outputs = [os.path.join(tmp, f"out{i}.txt") for i in range(len(jobs))]
        try:
            for (args, env), out in zip(jobs, outputs, strict=True):
                receiver, sender = ctx.Pipe(duplex=False)
                proc = ctx.Process(
                    target=_child_main,
                    args=(sender, out, dict(env or {}), cuda, timeout, module, qualname),
                    kwargs={"args": args, "kwargs": kwargs},
                    daemon=True,
                )
                with _main_module_left_out():
                    proc.start()
                sender.close()
                procs.append(proc)
                conns.append(receiver)
            results = _collect(procs, conns, names, outputs, timeout)
        finally:
            for proc in procs:
                if proc.exitcode is None:
                    proc.kill()
            for proc in procs:
                proc.join(10)
            for conn in conns:
                conn.close()
        for name, out in zip(names, outputs, strict=True):
            text = _read(out)
            if text.strip():
                sys.stderr.write(f"--- output of {name} ---\n{text}")
    return results


def _collect(
    procs: list[Any], conns: list[Any], names: list[str], outputs: list[str], timeout: float
) -> list[Any]:
    deadline = time.monotonic() + timeout
    results: list[Any] = [None] * len(procs)
    pending = set(range(len(procs)))
    while pending:
        remaining = deadline - time.monotonic()
        waitables = [conns[i] for i in pending] + [procs[i].sentinel for i in pending]
        ready = multiprocessing.connection.wait(waitables, timeout=max(remaining, 0))
        if not ready:
            for i in pending:
                procs[i].kill()
            for i in pending:
                procs[i].join(10)
            stuck = ", ".join(names[i] for i in sorted(pending))
            raise ChildFailed(
                f"timed out after {timeout:g} s: {stuck} did not finish and "
                f"{'was' if len(pending) == 1 else 'were'} killed",
                output="".join(f"[{names[i]}]\n{_read(outputs[i])}" for i in sorted(pending)),
            )
        for i in sorted(pending):
            conn, proc = conns[i], procs[i]
            if conn not in ready and proc.sentinel not in ready:
                continue
            if conn.poll():
                try:
                    status, payload = conn.recv()
                except EOFError:
                    status, payload = "died", None
            else:
                status, payload = "died", None
            pending.discard(i)
            if status == "ok":
                results[i] = payload
                continue
            proc.join(5)
            if status == "skip":
                import pytest

                pytest.skip(f"{names[i]}: {payload}")
            if status == "died":
                raise ChildFailed(
                    f"{names[i]} exited with code {proc.exitcode} without a result",
                    output=_read(outputs[i]),
                )
            raise ChildFailed(
                f"{names[i]} raised {payload['type']}: {payload['message']}",
                rank=i,
                type_name=payload["type"],
                message=payload["message"],
                traceback_text=payload["traceback"],
                output=_read(outputs[i]),
            )
    return results


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:
        return ""


def _child_main(
    conn: Any,
    output: str,
    env: dict[str, str | None],
    cuda: bool,
    timeout: float,
    module: str,
    qualname: str,
    *,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Entry point of a child: isolate, run the test function, send back what happened."""
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # A hang shows where it hangs: every thread's stack, shortly before the parent kills us.
    faulthandler.dump_traceback_later(max(timeout - 2.0, 1.0), exit=False)
    try:
        for name in list(os.environ):
            if name in LAUNCHER_ENV or name.startswith(LAUNCHER_ENV_PREFIXES):
                del os.environ[name]
        if not cuda:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if not cuda:
            import torch

            if torch.cuda.is_available():
                raise RuntimeError(
                    "CUDA_VISIBLE_DEVICES='' did not hide CUDA from this child; the CPU "
                    "contract cannot be tested in it"
                )
        func = getattr(importlib.import_module(module), qualname)
        message: tuple[str, Any] = ("ok", func(*args, **kwargs))
    except BaseException as exc:
        message = ("skip", str(getattr(exc, "msg", exc))) if _is_skip(exc) else _describe(exc)
    try:
        try:
            conn.send(message)
        except Exception as exc:  # an unpicklable return value
            conn.send(_describe(exc, "could not send the result back: "))
    finally:
        faulthandler.cancel_dump_traceback_later()
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()


def _describe(exc: BaseException, prefix: str = "") -> tuple[str, dict[str, str]]:
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    return (
        "raise",
        {
            "type": name,
            "message": prefix + str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        },
    )


def _is_skip(exc: BaseException) -> bool:
    """``pytest.skip()`` in a child (checked without importing pytest into every child)."""
    outcomes = sys.modules.get("_pytest.outcomes")
    return outcomes is not None and isinstance(exc, outcomes.Skipped)
