"""What a pytest test's call carries to its ranks (the ``payload`` of a ``Call``).

A distributed test is a ``Call`` of the rank-side runner with a :class:`TestRef` and a
:class:`FixturePlan`; under ``--dist-mptc`` a ``MultiProcessTestCase`` test is a
:class:`CaseCall`, answered with a :class:`CaseExit`. Stdlib only, like the rest of the
protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PLUGIN_FIXTURES = (
    "rank",
    "world_size",
    "local_rank",
    "local_device",
    "restart_count",
    "collectives",
)
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
        cls: Qualified name of the test class, or None for a plain function.
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
    """How to find a fixture function inside a rank: ``qualname`` in ``module`` (file
    ``path``), whose asserts pytest rewrote if ``rewrite``."""

    module: str
    path: str
    qualname: str
    rewrite: bool


ARG_VALUE = "value"
ARG_FIXTURE = "fixture"
ARG_REQUEST = "request"


@dataclass(frozen=True)
class Arg:
    """Where an argument of a test or rank-side fixture comes from.

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
        marks: The test's marks, closest first (those that pickle).
        config: ``(config.option, {ini name: config.getini(name)})`` pickled (the values that
            pickle), once per session; a rank unpickles it only when asked.
    """

    name: str
    nodeid: str
    marks: tuple[Any, ...]
    config: bytes


LOG_MARK = "\x1fharness-log\x1f"
"""Starts each line of a log record that a rank writes to its stderr during a pytest test,
followed by the test's phase and a space (:mod:`harness.rank.logs`): the controller moves
such lines from the rank's stderr into pytest's ``Captured log`` sections. (Not ``\x1e``:
``str.splitlines`` ends a line there.)"""


@dataclass(frozen=True)
class LogSettings:
    """How a rank captures a pytest test's log records: pytest's ``log_level`` (a number;
    None where unset: the loggers' own levels apply), ``log_format`` and ``log_date_format``."""

    level: int | None
    format: str
    date_format: str | None = None


@dataclass(frozen=True)
class FixturePlan:
    """What a rank needs to call a test.

    Attributes:
        fixtures: Rank-side fixtures, each after the ones it requests.
        values: Controller fixture values, by fixture name.
        request: For the ``request`` view, when the test or a rank-side fixture asks for it.
        basetemp: The controller's ``tmp_path_factory.getbasetemp()``, when a rank-side
            ``tmp_path_factory`` is used.
        logs: How the ranks capture the test's log records; None: they do not (pytest's
            logging plugin is off).
    """

    args: tuple[tuple[str, Arg], ...]
    fixtures: tuple[RankFixture, ...] = ()
    values: dict[str, Any] = field(default_factory=dict)
    request: RequestInfo | None = None
    basetemp: str | None = None
    logs: LogSettings | None = None


# -- a MultiProcessTestCase test (--dist-mptc) ------------------------------------------------


@dataclass(frozen=True)
class CaseCall:
    """One test of a ``MultiProcessTestCase`` class, as each of its processes would run it.

    A ``Call`` of its own runner, answered by ``Done`` with a ``CaseExit``, or by ``Failed``
    with the exit code in ``RankFailure.exitcode``.

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
    """How a rank's run of a ``CaseCall`` ended where its process may go on: ``exitcode`` 0
    or one of the class's skip codes, and the ``messages`` the rank sent through its pipe."""

    exitcode: int
    messages: tuple[str, ...] = ()
