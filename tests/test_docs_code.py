"""Every Python block in README.md and docs/ runs, so the docs cannot drift from the code.

Each ```python block runs alone, as a script in a fresh process, from a folder of its
own that stands for the repository's root (``examples/`` is there), against the test
session's Prefect server. A block that cannot run alone says so, right before its
fence, with ``<!-- not run: <reason> -->``; the collection test counts those, so no
block is skipped silently.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\S*)(.*)$")
NOT_RUN = re.compile(r"^<!-- not run: (.+?) -->$")
PYTHON = {"python", "py", "python3"}


@dataclass(frozen=True)
class Block:
    where: str  # file:line of the opening fence
    code: str
    not_run: str | None  # the reason given, for a block marked not to run


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(path: Path) -> list[Block]:
    """The file's fenced Python blocks, with the ``not run`` reason marked before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if opening.group(1).lower() in PYTHON:
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marked = NOT_RUN.match(before.strip())
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{i + 1}"
            code = "\n".join(lines[i + 1 : end]) + "\n"
            blocks.append(Block(where, code, marked.group(1) if marked else None))
        i = end + 1
    return blocks


BLOCKS = [b for path in doc_files() for b in python_blocks(path)]
RUN = [b for b in BLOCKS if b.not_run is None]


@pytest.mark.unit
def test_every_python_block_runs_or_says_why_not():
    """Counted from the raw text, so a block the parser missed cannot go unrun."""
    fences = sum(
        len(re.findall(r"^```(?:python|py|python3)\b", p.read_text(), re.M | re.I))
        for p in doc_files()
    )
    marked = [b for b in BLOCKS if b.not_run is not None]
    assert fences == len(BLOCKS) == len(RUN) + len(marked)
    assert all(b.not_run.strip() for b in marked)
    assert len(RUN) >= 10, [b.where for b in RUN]
    print(f"{len(BLOCKS)} python blocks: {len(RUN)} run, {len(marked)} marked not run")


@pytest.mark.system
@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_python_block_runs(block: Block, prefect_server: str, tmp_path: Path) -> None:
    """The block as a script, in a fresh process, from a folder standing for the repo root."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "block.py").write_text(block.code)
    proc = subprocess.run(
        [sys.executable, "block.py"],
        cwd=tmp_path,
        env={**os.environ, "PREFECT_API_URL": prefect_server},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{block.where}:\n{out[-4000:]}"


@pytest.mark.unit
def test_a_block_is_run_unless_marked_just_before_its_fence(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n```python\nprint(1)\n```\n\n<!-- not run: needs a GPU -->\n\n"
        "```python\nimport torch\n```\n\n```bash\nls\n```\n\n```py\nprint(2)\n```\n"
    )
    found = [(b.code, b.not_run) for b in python_blocks(page)]
    assert found == [("print(1)\n", None), ("import torch\n", "needs a GPU"), ("print(2)\n", None)]
