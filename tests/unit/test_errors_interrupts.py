"""What a ``KeyboardInterrupt`` that stopped a run carries (``harness.errors``): one layout of
the ranks' stacks, for the interpreter's note and the plugin's report alike."""

from __future__ import annotations

from harness.errors import (
    forget_interrupt_note,
    interrupt_sections,
    interrupt_stacks,
    note_interrupt,
)

SUMMARY = "the call of body was interrupted (KeyboardInterrupt)"


def test_the_note_reads_as_the_sections_say() -> None:
    interrupt = KeyboardInterrupt()
    note_interrupt(interrupt, SUMMARY, {1: "stack one\n", 0: ""}, "rank 0: #1 barrier")
    sections = interrupt_sections(interrupt)
    assert sections == [
        ("collectives", "rank 0: #1 barrier"),
        ("rank 0", "(no stack: the process had already ended)"),
        ("rank 1", "stack one"),
    ]
    lines = [SUMMARY]
    for heading, text in sections:
        lines += [f"---------- {heading} ----------", text]
    assert interrupt.__notes__ == ["\n".join(lines)]
    assert interrupt_stacks(interrupt) == (SUMMARY, {1: "stack one\n", 0: ""})
    forget_interrupt_note(interrupt)
    assert not hasattr(interrupt, "__notes__")
    assert interrupt_sections(interrupt) == sections  # the data stays


def test_without_collectives_the_ranks_alone() -> None:
    interrupt = KeyboardInterrupt()
    note_interrupt(interrupt, SUMMARY, {0: "stack zero"})
    assert interrupt_sections(interrupt) == [("rank 0", "stack zero")]


def test_an_interrupt_that_stopped_no_run_carries_nothing() -> None:
    interrupt = KeyboardInterrupt()
    assert interrupt_sections(interrupt) == []
    assert interrupt_stacks(interrupt) is None
