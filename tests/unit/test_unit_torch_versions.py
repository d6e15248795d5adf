"""The behaviours that differ between torch releases (``harness.versions``) agree with the
table of ``docs/reference/torch-versions.md``: each has its row, which changes at the first
release of the table's columns that has it; and each row is one of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import versions

ROOT = Path(__file__).resolve().parent.parent.parent


def _table() -> tuple[list[tuple[int, int]], list[list[str]]]:
    """The table's releases (its columns) and rows (first cell, then one per release, each
    ``same`` replaced by the cell before it)."""
    text = (ROOT / "docs" / "reference" / "torch-versions.md").read_text(encoding="utf-8")
    section = text.split("## What differs between them", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    releases = [versions.torch_release(cell) for cell in header[1:]]
    assert None not in releases, header
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for index in range(2, len(cells)):
            if cells[index] == "same":
                cells[index] = cells[index - 1]
        rows.append(cells)
    return releases, rows  # type: ignore[return-value]


def _row(rows: list[list[str]], behaviour: versions.Behaviour) -> list[str]:
    found = [row for row in rows if (row[0] + " |").startswith(behaviour.row)]
    assert len(found) == 1, f"{behaviour.row!r} names {len(found)} rows of the table"
    return found[0]


@pytest.mark.parametrize("behaviour", versions.BEHAVIOURS, ids=lambda b: b.row)
def test_each_behaviour_changes_its_row_at_its_release(behaviour: versions.Behaviour) -> None:
    releases, rows = _table()
    cells = _row(rows, behaviour)[1:]
    before = [
        cell for release, cell in zip(releases, cells, strict=True) if release < behaviour.since
    ]
    after = [
        cell for release, cell in zip(releases, cells, strict=True) if release >= behaviour.since
    ]
    assert before, f"the table has no column before {behaviour.since}"
    assert after, f"the table has no column from {behaviour.since} on"
    assert before[-1] != after[0], (behaviour, cells)


def test_each_row_of_the_table_is_a_behaviour() -> None:
    _, rows = _table()
    named = {tuple(_row(rows, behaviour)) for behaviour in versions.BEHAVIOURS}
    assert {tuple(row) for row in rows} == named


@pytest.mark.parametrize(
    ("version", "expected"),
    [("2.13.0+cpu", False), ("2.14.1", True), ("2.15.0a0+git1234", True), ("3.0.0", True)],
)
def test_has_reads_a_version_by_its_release(version: str, expected: bool) -> None:
    assert versions.has(versions.COLLECTIVE_HOOKS, version) is expected


def test_the_running_torch_answers_as_its_hooks_do() -> None:
    torch = pytest.importorskip("torch")
    hooks = hasattr(torch.distributed.ProcessGroup, "register_pre_hook")
    assert versions.has(versions.COLLECTIVE_HOOKS) is hooks
