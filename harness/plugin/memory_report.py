"""The run's memory, told: a line where a world's ranks are replaced for memory, and, at the
end, each kind of world's peak resident memory per rank and how many were replaced.

The worlds of a session are noted as they are made (:meth:`Worlds.add`) and read when the
session closes. Under pytest-xdist each worker sends its worlds' figures to the controller
(``workeroutput``, as pytest-cov sends its data), which sums them into its own summary: the
figures of every worker, by kind of world. The replacement line is what the World logs on the
``harness`` logger, written to the terminal (a worker's terminal is not shown: there, the
summary alone says it).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from harness.protocol.messages import megabytes

if TYPE_CHECKING:
    from harness.controller.world import World

OUTPUT_KEY = "harness_memory"
"""The key of a pytest-xdist worker's ``workeroutput`` that carries its worlds' figures."""

_WORLDS = pytest.StashKey["Worlds"]()
_LOGGER = "harness"


@dataclass
class Kind:
    """The worlds of one kind (size, backend): how many, their ranks' peaks, the replacements.

    Attributes:
        worlds: How many worlds of this kind were made.
        peaks: The largest peak resident memory of each rank, over those worlds, in bytes.
        replaced: How many times their ranks were replaced for memory.
    """

    worlds: int = 0
    peaks: dict[int, int] = field(default_factory=dict)
    replaced: int = 0

    def add(self, peaks: dict[int, int], replaced: int, worlds: int = 1) -> None:
        """Count in ``worlds`` more, with these peaks and replacements."""
        self.worlds += worlds
        self.replaced += replaced
        for rank, peak in peaks.items():
            self.peaks[rank] = max(self.peaks.get(rank, 0), peak)


class Worlds:
    """A run's worlds: those of this process as they are made, and, in the controller of
    pytest-xdist, the figures its workers sent."""

    def __init__(self) -> None:
        self._live: list[tuple[str, World]] = []
        self.kinds: dict[str, Kind] = {}

    def add(self, world: World) -> None:
        """Note a world made for a test, and count in those closed since the last one (a run
        with ``--dist-isolate`` makes one per test: they are not all kept)."""
        self._fold(closed_only=True)
        ranks = f"{world.world_size} rank" + ("" if world.world_size == 1 else "s")
        init = "" if world.init else ", no default group"
        self._live.append((f"{ranks} ({world.backend}{init})", world))

    def close(self, config: pytest.Config) -> None:
        """Count in every world noted; in a pytest-xdist worker, send the figures."""
        self._fold(closed_only=False)
        output = getattr(config, "workeroutput", None)
        if output is not None:
            output[OUTPUT_KEY] = json.dumps(
                {
                    name: [kind.worlds, kind.peaks, kind.replaced]
                    for name, kind in self.kinds.items()
                }
            )

    def merge(self, sent: str) -> None:
        """Count in what a pytest-xdist worker sent."""
        for name, (worlds, peaks, replaced) in json.loads(sent).items():
            ranks = {int(rank): peak for rank, peak in peaks.items()}
            self.kinds.setdefault(name, Kind()).add(ranks, replaced, worlds)

    def lines(self) -> list[str]:
        """The summary: a line per kind of world that said its memory."""
        found = []
        for name, kind in sorted(self.kinds.items()):
            if not kind.peaks:
                continue
            peaks = ", ".join(
                f"{megabytes(peak)} (rank {rank})" for rank, peak in sorted(kind.peaks.items())
            )
            count = f"{kind.worlds} world" + ("" if kind.worlds == 1 else "s")
            found.append(
                f"harness: worlds of {name}, peak resident memory per rank: {peaks}; {count}, "
                f"{kind.replaced} replaced for memory"
            )
        return found

    def _fold(self, *, closed_only: bool) -> None:
        kept = []
        for name, world in self._live:
            if closed_only and not world.closed:
                kept.append((name, world))
                continue
            peaks = {rank: memory.peak for rank, memory in world.memory.items()}
            self.kinds.setdefault(name, Kind()).add(peaks, world.replaced_for_memory)
        self._live = kept


def of(config: pytest.Config) -> Worlds:
    """The run's worlds, kept on the config."""
    found = config.stash.get(_WORLDS, None)
    if found is None:
        found = config.stash[_WORLDS] = Worlds()
    return found


class _Terminal(logging.Handler):
    """Writes the ``harness`` logger's lines (a world replaced for memory) to the terminal."""

    def __init__(self, reporter: Any) -> None:
        super().__init__(logging.WARNING)
        self._reporter = reporter

    def emit(self, record: logging.LogRecord) -> None:
        self._reporter.write_line(record.getMessage(), yellow=True)


def tell_replacements(config: pytest.Config) -> None:
    """Write each line of the ``harness`` logger to the terminal, until the run ends."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput"):
        return
    handler = _Terminal(reporter)
    logger = logging.getLogger(_LOGGER)
    logger.addHandler(handler)
    config.add_cleanup(lambda: logger.removeHandler(handler))
