"""Every ```python block of the documentation (docs/*.md and README.md) runs here.

So the docs cannot rot: an example that stops working fails this suite.

* A block that defines pytest tests (it uses ``@pytest.mark.distributed`` or ``def test_``)
  is written to a test file and run with ``pytester`` (``-p no:randomly``). It must pass,
  unless an HTML comment right before its fence says what it demonstrates instead:
  ``<!-- expect: failed=1 passed=1 warnings=1 -->`` (the counts of ``assert_outcomes``).
  ``<!-- args: --dist-verify -->`` adds command-line arguments, ``<!-- file: test_sum.py -->``
  names the file (default ``test_example.py``: the reports shown in the docs name it), and
  ``<!-- run: subprocess -->`` runs pytest in a subprocess. ``<!-- needs: collective-hooks -->``
  skips it on torch without process-group hooks (< 2.14), where what it shows is not seen;
  ``<!-- needs: torch>=2.10 -->`` on an older torch.
  When a ```text block follows it (before the next heading), that block is the report the
  docs show: its key lines (the error's summary line, verdict lines, the repro command, an
  order dependence's message) must appear in the real output, so a shown report cannot
  drift from what the harness prints.
* Any other block is a script: it runs as ``python example.py`` in an empty directory and
  must exit 0. It runs with CUDA hidden (``CUDA_VISIBLE_DEVICES=""``), so that its
  ``"auto"`` backend is Gloo on any machine, as the pytest examples run on Gloo
  (``--dist-backend=gloo``, see conftest.py).

Blocks that are not meant to run (fragments, shell, configuration) use another fence
language (``text``, ``sh``, ``ini``, ``toml``, ``yaml``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness import versions

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
_DIRECTIVE = re.compile(r"<!--\s*(?P<key>expect|args|file|run|needs)\s*:\s*(?P<value>.*?)\s*-->")
_TEST_BLOCK = re.compile(r"@pytest\.mark\.distributed|^\s*def test_", re.MULTILINE)


@dataclass
class Block:
    """One fenced ```python block of a page and the directives right before it."""

    page: Path
    line: int
    code: str
    directives: dict[str, str] = field(default_factory=dict)
    shown: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def is_test(self) -> bool:
        return bool(_TEST_BLOCK.search(self.code))


def parse(page: Path) -> list[Block]:
    """The ```python blocks of ``page``, with the ``<!-- key: value -->`` directives found
    on the lines right before each fence (blank lines between are allowed)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    pending: dict[str, str] = {}
    last: Block | None = None  # the python block a following text block shows the output of
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _DIRECTIVE.search(line)
        fence = _FENCE.match(line)
        if directive:
            for found in _DIRECTIVE.finditer(line):
                pending[found["key"]] = found["value"]
            i += 1
            continue
        if fence is None:
            if line.strip():
                pending = {}
            if line.startswith("#"):
                last = None
            i += 1
            continue
        start, marker, lang = i, fence["fence"], fence["lang"].lower()
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(marker):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if lang in ("python", "py", "python3"):
            code = textwrap.dedent("\n".join(body)) + "\n"
            last = Block(page, start + 1, code, pending)
            blocks.append(last)
        elif lang == "text" and last is not None and last.shown is None:
            last.shown = "\n".join(body)
        pending = {}
    return blocks


BLOCKS = [block for page in PAGES for block in parse(page)]


_KEY_LINE = re.compile(
    r"^(?:RankError|WorldTimeout|WorldHang|CollectiveMismatch|RankCrash|RankLeak"
    r"|ShadowMismatch|ShadowUnfaithful): "
    r"|^rank \d+ never reached |^run \(|^confirmed on fresh processes; |^The deadline was "
    r"|^\S+ (?:failed|passed) (?:after|on a reused world) "
    # A fault sweep's summary: its headings, ranges and failing kill points.
    r"|^\S+::\S+: \w+.*, \d+ cases?, \d+ failed$|^  (?:kill|exit|error|delay|hang|corrupt)\b"
    r"|^  failed at rank \d"
)


def key_lines(shown: str) -> list[str]:
    """The lines of a shown report that must be in the real output: the error's summary,
    verdicts, the repro command, an order dependence's message (without its file path), a
    fault sweep's summary."""
    found = []
    for line in shown.splitlines():
        if "OrderDependenceWarning: " in line:
            found.append(line.split("OrderDependenceWarning: ", 1)[1])
        elif _KEY_LINE.match(line):
            found.append(line)
    return found


def _expected(text: str) -> dict[str, int]:
    counts = {}
    for part in text.split():
        key, _, value = part.partition("=")
        counts[key] = int(value)
    return counts


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_example(block: Block, pytester: pytest.Pytester) -> None:
    if block.is_test:
        _run_tests(block, pytester)
    else:
        _run_script(block, pytester.path)


def _needs(block: Block) -> None:
    """Skip ``block`` where this torch lacks what its ``needs`` directive names."""
    needs = block.directives.get("needs")
    if needs is None:
        return
    import torch
    import torch.distributed as dist

    if needs.startswith("torch>="):
        wanted = versions.torch_release(needs.removeprefix("torch>="))
        assert wanted is not None, f"{block.id}: unknown need {needs!r}"
        here = versions.torch_release(torch.__version__)
        if here is not None and here < wanted:
            pytest.skip(f"the example needs {needs}; this is torch {torch.__version__}")
        return
    assert needs == "collective-hooks", f"{block.id}: unknown need {needs!r}"
    if not hasattr(getattr(dist, "ProcessGroup", None), "register_pre_hook"):
        pytest.skip("torch < 2.14 has no process-group hooks: DDP's collectives are not seen")


def _run_tests(block: Block, pytester: pytest.Pytester) -> None:
    _needs(block)
    name = block.directives.get("file", "test_example.py").removesuffix(".py")
    pytester.makepyfile(**{name: block.code})
    args = ["-p", "no:randomly", *shlex.split(block.directives.get("args", ""))]
    # An example that leases GPUs does so in a directory of its own, not the user's.
    args += ["-o", f"dist_gpu_lease_dir={pytester.path / 'gpu-leases'}"]
    if block.directives.get("run") == "subprocess":
        result = pytester.runpytest_subprocess(*args)
    else:
        result = pytester.runpytest(*args)
    output = result.stdout.str()
    for line in key_lines(block.shown or ""):
        assert line in output, f"{block.id} shows a line the run did not print:\n{line}\n{output}"
    expect = block.directives.get("expect")
    if expect is not None:
        result.assert_outcomes(**_expected(expect))
        return
    outcomes = result.parseoutcomes()
    message = f"the example of {block.id} should pass: {outcomes}\n{output}"
    assert result.ret == 0, message
    assert outcomes.get("passed", 0) > 0, message
    assert not {"failed", "errors", "error"} & set(outcomes), message


def _run_script(block: Block, directory: Path) -> None:
    script = directory / "example.py"
    script.write_text(block.code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=directory,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (
        f"the script of {block.id} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
    )


def test_shown_reports_are_checked() -> None:
    """Every report the docs show after a failing example has lines that are checked."""
    for block in BLOCKS:
        if block.is_test and _expected(block.directives.get("expect", "")).get("failed"):
            assert block.shown is not None, f"{block.id}: no report shown after it"
            assert key_lines(block.shown), f"{block.id}: its report has no checked line"


def test_examples_found() -> None:
    """The docs have examples, and each page's python blocks are all seen (an indented or
    otherwise unusual fence would be missed silently)."""
    assert len(BLOCKS) >= 10
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        fences = len(re.findall(r"^[ \t]*```+\s*(?:python|py|python3)\s*$", text, re.M))
        assert fences == sum(block.page == page for block in BLOCKS), page


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_outside_references(page: Path) -> None:
    """The docs stand on their own: no link into a directory outside the repository."""
    assert "../shared" not in page.read_text(encoding="utf-8")
