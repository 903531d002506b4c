"""Every chapter notebook has the same frame: what you will be able to do, at the top; what this run
measured and where to go next, at the end. Reads the notebooks' JSON only (no kernel): a second.

The frame, notebook by notebook:

- The first cell is markdown: the chapter's ``# N · title``, then a paragraph that starts with
  ``**After this chapter you will be able to**`` (``**After this part ...**`` in ``05b``, the second
  part of chapter 5). Chapter 0, the welcome, keeps the same phrase: it too has things to do (a
  first generation, a first ``check``).
- Near the end, a markdown cell ``## What we measured...``, then the one code cell that assembles
  this run's measurements into a summary, then a last markdown cell: what to read or try next. In
  every notebook but the last it names the next one (``**Chapter N**``, ``part 2``, or its file).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
OBJECTIVES = re.compile(r"^\*\*After this (chapter|part) you will be able to\*\*", re.M)
RECAP = "## What we measured"


def _cells(path: Path) -> list[dict]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [{"type": c["cell_type"], "source": "".join(c["source"])} for c in cells]


def _chapter(path: Path) -> tuple[int, str]:
    """``05b_paged_kernel`` -> (5, "b")."""
    match = re.match(r"(\d\d)([a-z]?)_", path.name)
    assert match, f"{path.name}: a notebook's name starts with its chapter number, e.g. 05_ or 05b_"
    return int(match.group(1)), match.group(2)


def test_chapters_are_numbered_from_0_without_gaps():
    numbers = [number for number, part in map(_chapter, NOTEBOOKS) if not part]
    assert numbers == list(range(len(numbers))), [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_states_its_objectives_first(path: Path):
    first = _cells(path)[0]
    number, part = _chapter(path)
    assert first["type"] == "markdown", f"{path.name}: the first cell must be the chapter's introduction (markdown)"
    assert first["source"].startswith(f"# {number} · "), f"{path.name}: the first cell starts with '# {number} · title'"
    match = OBJECTIVES.search(first["source"])
    assert match, f"{path.name}: the first cell needs a paragraph starting '**After this chapter you will be able to**'"
    assert match.group(1) == ("part" if part else "chapter"), f"{path.name}: say 'this {'part' if part else 'chapter'}'"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_ends_with_a_recap_and_what_is_next(path: Path):
    cells = _cells(path)
    assert len(cells) >= 3, path.name
    heading, summary, last = cells[-3:]
    assert heading["type"] == "markdown" and heading["source"].startswith(RECAP), (
        f"{path.name}: the third cell from the end must be the '{RECAP}' heading"
    )
    assert summary["type"] == "code" and summary["source"].strip(), (
        f"{path.name}: after '{RECAP}', one code cell that assembles this run's measurements"
    )
    assert last["type"] == "markdown" and last["source"].strip(), (
        f"{path.name}: the last cell must say, in markdown, what to read or try next"
    )
    assert RECAP not in last["source"], (
        f"{path.name}: the last cell must come after the summary, not repeat its heading"
    )
    index = NOTEBOOKS.index(path)
    if index + 1 < len(NOTEBOOKS):
        following = NOTEBOOKS[index + 1]
        number, part = _chapter(following)
        names = [following.name, f"Chapter {number}**"] + (["part 2"] if part else [])
        assert any(name in last["source"] for name in names), (
            f"{path.name}: the last cell must point to {following.name} (one of {names})"
        )
