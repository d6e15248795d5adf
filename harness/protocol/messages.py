"""The messages a controller and its ranks exchange, one class each.

Each rank has one duplex pipe to its controller. Everything that crosses it is one of the
classes below, so the protocol can be read here in one place:

controller -> rank
    ``Call``     run one function and answer with ``Done``, ``Failed`` or ``Skipped``
                 (a pytest test whose body failed sends ``Failing`` first).
    ``Regroup``  make a fresh default process group (every rank's call destroyed the
                 harness's) and answer with ``Ready`` or ``Failed``.

rank -> controller
    ``Ready``    the rank is up: its default process group is, unless the world has none
                 (answers the start of a rank, and ``Regroup``).
                 It also names the rank's main and watchdog threads and where its own code
                 lives, so that its stack dumps can be made readable.
    ``Done``     the call returned; ``value`` is its pickled return value.
    ``Failing``  the test body (or a rank-side fixture's setup) of a pytest test call
                 raised; sent before the rank tears down that test's rank-side fixtures,
                 which may take long, and followed by the call's ``Failed`` unless the rank
                 is torn down first.
    ``Failed``   the call (or start-up) raised; the rank exits right after sending this, so
                 peers blocked in a collective with it fail at once instead of waiting for
                 the process-group timeout.
    ``Skipped``  the call raised a skip exception (pytest's or unittest's).

User objects travel pre-pickled as ``bytes``: the messages themselves always pickle, and a
failure to (un)pickle user data is reported by the side that saw it, naming the object.

Three things need no message. Stopping: a second pipe, the rank's lifeline, is read by the
rank's watchdog thread; when the controller closes it (or dies) that thread saves coverage
and ends the rank, also while its main thread is stuck in a collective. Stack dumps: the
controller sends ``STACKS_SIGNAL`` and reads the dump from the rank's files
(:mod:`harness.protocol.rank_files`), which works while the rank's main thread is blocked.
Collective traces: the controller writes ``TRACE_REQUEST`` on the lifeline, and the
watchdog thread writes what the call in progress has issued so far (between calls: what the
last call issued) into the rank's ``trace`` file; this works while the main thread is
blocked in a collective or a sleep (they release the GIL), where a Python signal handler
would never run.

A unittest ``MultiProcessTestCase`` test (``--dist-mptc``) is a ``Call`` of its own runner
with a ``CaseCall``; each rank answers ``Done`` with a ``CaseExit``, or ``Failed`` with the
exit code in ``RankFailure.exitcode``.

A pytest test is a ``Call`` of the rank-side test runner with a ``TestRef`` (where the test
is) and a ``FixturePlan`` (its arguments: controller fixture values, and the fixtures that run
in the ranks, ``RankFixture``). A fixture wider than a function keeps living in the ranks
between calls; the controller ends it with a ``Call`` of the runner's scope teardown.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from harness.protocol.failures import RankFailure
from harness.protocol.traces import Fingerprint, RankTrace

STACKS_SIGNAL = signal.SIGUSR1
"""The signal on which a rank dumps every thread's stack into its ``stacks`` file."""

TRACE_REQUEST = b"trace"
"""Written on a rank's lifeline: the rank writes its collective trace into its ``trace`` file."""


@dataclass(frozen=True)
class RankSetup:
    """What a rank is told when it starts (the process argument, not a pipe message).

    Attributes:
        rank: Global rank.
        world_size: Number of ranks.
        backend: Resolved backend (``"gloo"`` or ``"nccl"``), never ``"auto"``.
        init: Whether the rank makes the default process group when it starts. Without
            (``World(init=False)``) each call brings its own rendezvous (``Call.rendezvous``).
        inherited: The controller's ``os.environ`` when the rank started. A forked rank would
            otherwise see the forkserver's environment, frozen when that server started.
        env: The rank's torchrun variables, set over ``inherited``.
        workdir: The world generation's private directory (see
            :mod:`harness.protocol.rank_files`).
        coverage: The controller's coverage options (``{"run:branch": True, ...}``) and
            ``"config_file"``, for the rank's own ``coverage.Coverage``; None when the
            controller is not measured.
    """

    rank: int
    world_size: int
    backend: str
    init: bool
    inherited: dict[str, str]
    env: dict[str, str]
    workdir: str
    coverage: dict[str, Any] | None


OUTPUT_INHERIT = "inherit"
OUTPUT_CAPTURE = "capture"
OUTPUT_PREFIX = "prefix"
OUTPUTS = (OUTPUT_INHERIT, OUTPUT_CAPTURE, OUTPUT_PREFIX)
"""Where a rank's output goes during a call (``Call.output``)."""


@dataclass(frozen=True)
class Call:
    """Run ``fn(*args, **kwargs)`` from the pickled ``payload`` (a ``(fn, args, kwargs)`` tuple).

    ``output`` says where the rank's stdout/stderr file descriptors go during the call:
    ``OUTPUT_CAPTURE`` to its capture files (the controller reads them afterwards, even after a
    crash), ``OUTPUT_PREFIX`` to its own streams with each line prefixed ``[rank N]``,
    ``OUTPUT_INHERIT`` nowhere else.
    ``env`` is how the controller's ``os.environ`` now differs from the one the rank started
    with (a fixture's ``monkeypatch.setenv``, pytest's ``PYTEST_CURRENT_TEST``): each changed
    variable with its new value, None for one that was removed. The call sees the change,
    under the rank's own torchrun variables, and the rank's environment is restored afterwards.
    Only the change travels: setting a whole environment costs milliseconds per call.
    ``seed``, when given, seeds every random generator of the rank before the call (torch
    CPU and CUDA, ``random``, numpy's global one), so that it draws what a fresh process
    seeded alike would.
    ``rendezvous``, in a world without a harness group (``World(init=False)``), is this
    call's private rendezvous: ``MASTER_PORT`` (a port free when the call was sent) and
    ``INIT_METHOD`` (``file://`` and a file in the world's private directory that no call
    used before). They are set over the rank's torchrun variables for this call only, so
    that ``init_process_group`` (``env://``), ``init_method=os.environ["INIT_METHOD"]`` and
    ``fhelium.distributed.init()`` meet the other ranks of this call and nobody else. They
    travel here rather than in ``env``, which never changes a rank's torchrun variables.
    None in a world with a harness group.
    ``check_leaks``: whether the rank looks for what the call leaves behind (threads,
    child processes, open files; see ``Done.leaks``).
    ``check_collectives``: whether the rank sends the fingerprint of the collectives it
    issued in its ``Done`` (``Done.collectives``), for the controller's desync check. They
    are recorded either way, and always sent whole with ``Failed`` and ``Skipped``.
    """

    payload: bytes
    output: str = OUTPUT_INHERIT
    env: dict[str, str | None] | None = None
    seed: int | None = None
    rendezvous: dict[str, str] | None = None
    check_leaks: bool = True
    check_collectives: bool = True


@dataclass(frozen=True)
class Regroup:
    """Make a fresh default process group on a ``FileStore`` at ``store`` (a file in the
    world's private directory, new each time) and answer ``Ready``, or ``Failed`` and exit.

    Sent to every rank right after a call that destroyed the harness's default group on
    every rank, so that the next call has one again, on the same processes.
    """

    store: str


@dataclass(frozen=True)
class Ready:
    """The rank is up, with its default process group unless the world has none (the answer
    to a rank's start), or its fresh default group is (the answer to ``Regroup``).

    Attributes:
        main_thread: Ident of the rank's main thread (listed first in its stacks).
        watchdog_thread: Ident of the harness's watchdog thread (left out of its stacks).
        code_dir: Directory of the rank-side harness code in that process; outermost frames
            there are left out of its stacks (the rank may run another copy of the package
            than the controller, such as a source checkout beside an install).
    """

    main_thread: int
    watchdog_thread: int
    code_dir: str


@dataclass(frozen=True)
class Done:
    """The call returned normally.

    ``reusable`` is False when the call left the rank unfit for another call, so the
    controller rebuilds the world first (a collective raised and the call went on: its
    group may be broken). ``group_count`` is the rank's process-group counter
    after the call: ranks whose counters differ (a ``new_group`` called on some ranks only)
    could not meet in their next group. ``grouped`` is whether the harness's default
    process group is still the rank's default group after the call (False: the call
    destroyed it, maybe making one of its own; always False without a harness group): on
    every rank, the controller has a fresh one made (``Regroup``); on some only, the ranks
    are out of step and the world is rebuilt.
    ``leaks`` is what the call left running or open in the rank, one line each
    (``"thread 'worker' started at test_x.py:12 is still alive"``; see
    :mod:`harness.rank.leaks`); empty when nothing, or when the call did not ask.
    ``collectives`` is the fingerprint of the collectives the call issued (see
    :data:`harness.protocol.traces.Fingerprint`), when the call asked for the desync check
    (``Call.check_collectives``); else None. Where the ranks' fingerprints differ, the
    controller asks for their whole traces (``TRACE_REQUEST``), which the ranks keep until
    their next call.
    ``output_written`` is False when the call's output was captured (``Call.output``) and it
    wrote none: the controller then does not read the rank's capture files (most calls
    print nothing, and reading them is part of every test's cost).
    """

    value: bytes
    reusable: bool = True
    group_count: int = 0
    grouped: bool = True
    leaks: tuple[str, ...] = ()
    collectives: Fingerprint | None = None
    output_written: bool = True


@dataclass(frozen=True)
class Failed:
    """The call or the rank's start-up raised.

    ``at`` is ``time.monotonic()`` when the exception was caught; the monotonic clock is
    shared by all processes of a machine, so the controller can tell which rank failed first.
    ``trace`` is what collectives the call had issued (None for a failed start-up).
    """

    failure: RankFailure
    at: float
    trace: RankTrace | None = None


@dataclass(frozen=True)
class Failing:
    """A pytest test's body, or the setup of one of its rank-side fixtures, raised; the rank
    now tears down the fixtures already set up, then answers the call with ``Failed``.

    That teardown may take long (a fixture that waits for its peers, or sleeps), and a rank
    still in it when the controller stops waiting is torn down: so the failure is sent
    first. The controller takes it as the rank's ``Failed`` at once (the root cause is the
    rank that failed first, and the peers' grace period starts); the ``Failed`` that follows
    replaces it but keeps its ``at``. Fields as in ``Failed``: ``at`` is when the body
    raised; ``trace`` what collectives the call had issued by then.
    """

    failure: RankFailure
    at: float
    trace: RankTrace | None = None


@dataclass(frozen=True)
class Skipped:
    """The call raised a skip exception; ``kind`` is ``"pytest"`` or ``"unittest"``;
    ``phase`` is the pytest phase it belongs to (``"setup"`` when a rank-side fixture
    skipped, see ``PHASE_ATTR``); ``trace`` what collectives the call had issued."""

    reason: str
    kind: str
    at: float
    phase: str = "call"
    trace: RankTrace | None = None


RankMessage = Ready | Done | Failing | Failed | Skipped
"""Everything a rank sends."""


# -- the payload of a pytest test call -------------------------------------------------------

PLUGIN_FIXTURES = ("rank", "world_size", "local_rank", "local_device")
"""The plugin's own fixtures: values only a rank knows."""

PER_PROCESS_FIXTURES = (
    "monkeypatch",
    "capsys",
    "capsysbinary",
    "capfd",
    "capfdbinary",
    "caplog",
    "recwarn",
)
"""pytest's built-in fixtures that run in the ranks of a distributed test (and ``request``,
which every fixture can ask for, gets a rank-side view there). ``tmp_path_factory`` is not
one: it is the session's, the same for every rank (a rank-side consumer gets a twin)."""

IN_RANKS_ATTR = "__harness_in_ranks__"
"""Set (True) on a fixture function by ``harness.fixture``: it runs inside the ranks."""


@dataclass(frozen=True)
class TestRef:
    """How to find a test function inside a rank (never the function object itself).

    Attributes:
        module: The module's name in the controller's ``sys.modules``.
        path: The module's file.
        cls: Qualified name of the test class, or None for a plain function.
        function: The function's name in its module or class.
        sys_path: The controller's ``sys.path`` when the test ran.
        rewrite: Whether pytest rewrote the module's asserts in the controller.
        instance_state: The controller's test-class instance ``__dict__`` (what xunit-style
            ``setup_method`` put there), copied onto the rank's instance.
    """

    __test__ = False  # not a test class, whatever pytest's collection patterns say

    module: str
    path: str
    cls: str | None
    function: str
    sys_path: tuple[str, ...]
    rewrite: bool
    instance_state: dict[str, Any] | None = None


@dataclass(frozen=True)
class FunctionRef:
    """How to find a fixture function inside a rank: ``qualname`` in the module ``module``
    (file ``path``; asserts rewritten when ``rewrite``)."""

    module: str
    path: str
    qualname: str
    rewrite: bool


ARG_VALUE = "value"
ARG_FIXTURE = "fixture"
ARG_REQUEST = "request"


@dataclass(frozen=True)
class Arg:
    """Where one argument of a test or rank-side fixture comes from.

    ``kind`` is ``ARG_VALUE`` (a controller fixture's value, ``FixturePlan.values[key]``),
    ``ARG_FIXTURE`` (the rank-side fixture whose ``RankFixture.key`` is ``key``) or
    ``ARG_REQUEST`` (the rank's view of pytest's ``request``).
    """

    kind: str
    key: str = ""


@dataclass(frozen=True)
class RankFixture:
    """A fixture that runs inside the ranks.

    Attributes:
        key: Identifies the fixture in this plan and, with ``scope_key``, in the rank's cache.
        name: The fixture's name (``request.fixturename``).
        scope: ``"function"``, ``"class"``, ``"module"``, ``"package"`` or ``"session"``.
        scope_key: The node id of the scope's node (``""`` for the session): the rank keeps a
            wider-scoped fixture until the controller ends that scope.
        function: The user's fixture function, or None for one of the built-ins.
        builtin: Which built-in (``"rank"``, ``"monkeypatch"``, ...) when ``function`` is None.
        args: The fixture's arguments, by name.
        param: ``request.param`` for a parametrized fixture (``has_param``).
    """

    key: str
    name: str
    scope: str
    scope_key: str
    function: FunctionRef | None
    builtin: str | None
    args: tuple[tuple[str, Arg], ...]
    param: Any = None
    has_param: bool = False


@dataclass(frozen=True)
class RequestInfo:
    """What the rank's view of pytest's ``request`` can answer (sent only when asked for).

    Attributes:
        name: The test's ``node.name``.
        nodeid: The test's ``node.nodeid``.
        marks: The test's marks, closest first (those that pickle).
        options: ``config.option`` (the values that pickle).
        ini: ``config.getini`` of every ini option (the values that pickle).
    """

    name: str
    nodeid: str
    marks: tuple[Any, ...]
    options: dict[str, Any]
    ini: dict[str, Any]


@dataclass(frozen=True)
class FixturePlan:
    """What a rank needs to call a test: its arguments, the rank-side fixtures behind them
    (in setup order) and the controller fixtures' values.

    Attributes:
        args: The test function's arguments, by name.
        fixtures: Rank-side fixtures, each after the ones it requests.
        values: Controller fixture values, by fixture name.
        request: For the ``request`` view, when the test or a rank-side fixture asks for it.
        basetemp: The controller's ``tmp_path_factory.getbasetemp()``, when a rank-side
            ``tmp_path_factory`` is used.
    """

    args: tuple[tuple[str, Arg], ...]
    fixtures: tuple[RankFixture, ...] = ()
    values: dict[str, Any] = field(default_factory=dict)
    request: RequestInfo | None = None
    basetemp: str | None = None


# -- the payload of a MultiProcessTestCase test call (--dist-mptc) ---------------------------


@dataclass(frozen=True)
class CaseCall:
    """One test of a ``MultiProcessTestCase`` class, as each of its processes would run it.

    Attributes:
        test: Where the class is (``cls``: its attribute path in the module) and the test
            method's name (``function``).
        file_name: The case's ``self.file_name``, made by its ``setUp`` in the controller.
        kwargs: The keyword arguments the class gives each process's ``_run``.
        environ: The whole environment the test runs with: the controller's, as the case's
            ``setUp`` left it (a native process inherits its parent's), without the rank's
            own torchrun and rendezvous variables; the rank's own come back after the call.
    """

    test: TestRef
    file_name: str
    kwargs: dict[str, Any]
    environ: dict[str, str]


@dataclass(frozen=True)
class CaseExit:
    """How a rank's run of a ``CaseCall`` ended, where its process may go on: exit code 0
    or one of the class's skip codes, and what the rank sent through its pipe."""

    exitcode: int
    messages: tuple[str, ...] = ()
