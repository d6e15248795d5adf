"""The rank side, run inside each rank process.

Everything here runs INSIDE a rank process, never in the controller.

* :mod:`~harness.rank.entry`        what the controller names (a rank's target, a test
  body's runner), importing the rest only once it runs in the rank
* :mod:`~harness.rank.server`       the forkserver's first preload: its name, torch's warnings
* :mod:`~harness.rank.preload`      the forkserver's last: the project's warm-up (``dist_preload``)
* :mod:`~harness.rank.title`        process titles (``harness rank 1/4 (gloo)``)
* :mod:`~harness.rank.loop`         a rank's life: start-up, serving calls, exit
* :mod:`~harness.rank.context`      a rank's state, passed to what serves it; the call in progress
* :mod:`~harness.rank.current`      the process's rank context, for what is handed none
* :mod:`~harness.rank.exits`        where a rank left through ``os._exit``
* :mod:`~harness.rank.reset`        what a call changed, put back before the next; seeding
* :mod:`~harness.rank.leaks`        what a call left behind that no reset undoes
* :mod:`~harness.rank.memory`       memory between calls: measured, given back, growth named
* :mod:`~harness.rank.recording`    the collectives a call issues, from every source (a package)
* :mod:`~harness.rank.sites`        a collective's call site, a blocked thread's position
* :mod:`~harness.rank.inject`       faults placed at collectives (``harness.faults``), acted out
* :mod:`~harness.rank.holds`        a schedule's holds at collective boundaries, acted out
* :mod:`~harness.rank.output`       where a call's stdout/stderr go (captured, prefixed)
* :mod:`~harness.rank.logs`         a call's log records, for pytest's "Captured log" sections
* :mod:`~harness.rank.pytest_body`  where a pytest test body runs
* :mod:`~harness.rank.importer`     a test's module, imported as the controller did
* :mod:`~harness.rank.property_body` where one Hypothesis example of a property test runs
* :mod:`~harness.rank.sweep_body`   a sweep's work: a clean run's collectives counted, ``verify=``
* :mod:`~harness.rank.fixtures`     rank-side fixtures: setup, scopes, teardown, ``request``
* :mod:`~harness.rank.builtin_fixtures` pytest's per-process built-ins, made in the rank
* :mod:`~harness.rank.identity`     the plugin's rank-side fixture values (``rank``, ...)
* :mod:`~harness.rank.mptc_body`    a ``MultiProcessTestCase`` test on a reused rank
* :mod:`~harness.rank.check_rows`   ``python -m harness check``: one row run, verified, timed
* :mod:`~harness.rank.collective_kinds` how each kind it checks is called, what it produces
* :mod:`~harness.rank.coverage`     coverage measured inside the rank

What these modules may import, said here once for all of them: the standard library,
``torch``, ``fhelium.distributed``, the protocol (:mod:`harness.protocol`),
``harness.compat`` and ``harness.faults``, and each other. Private APIs (of torch, pytest,
CPython) and pytest itself only through ``harness.compat``, and pytest only when the rank
runs a pytest test. Never the controller (``harness.controller``), the plugin or the command
line: a rank never spawns ranks through the controller's machinery. An import-linter
contract in ``pyproject.toml`` enforces the sides. Stricter still, ``check_rows`` and
``collective_kinds`` use the standard library, torch, ``fhelium.distributed`` and each other
alone, so that ``python -m harness check`` tests torch.distributed and not the harness. The
modules are preloaded into the forkserver, so none may touch CUDA at import time.

What a rank keeps lives on its :class:`~harness.rank.context.RankContext`, reached through
:mod:`~harness.rank.current` by code that is handed no context: that is the rank side's
module-level state. Besides it, modules keep only constants, caches of what does not change
in a process, :mod:`~harness.rank.recording.hooks`' own (the groups its hooks are on, the
collectives between their two hooks, the warnings it gave once) and
:mod:`~harness.rank.holds`' (the number of its calls with holds).
"""

import os

CODE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
"""The rank side's directory: its frames are left out of the tracebacks and stacks shown."""
