"""Every outside fact the course states names its source: a key in brackets, ``[vllm-paper]``, whose
entry in ``docs/references.md`` gives the source (with its address) and quotes the passage each claim
rests on. Reads text only: a second.

Where citations are looked for: the notebooks' markdown and the strings of their code cells (prose a
cell prints), the README and docs' own pages, and the strings of minillm's, the exercises' and the
solutions' Python files (docstrings, messages). A key is lowercase words joined by hyphens, the first
starting with a letter, with at least one hyphen, so that ``[x]``, ``[0-9]`` or a list in prose never
reads as one.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "docs" / "references.md"
KEY = r"[a-z][a-z0-9]*(?:-[a-z0-9]+)+"
CITATION = re.compile(rf"\[({KEY})\](?!\()")  # not a markdown link's text: [text](address)
ENTRY = re.compile(rf"^### ({KEY})\s*$", re.M)


def _strings(source: str) -> list[str]:
    """The string constants of Python source (f-strings' literal parts included); IPython's ``%`` and
    ``!`` lines are dropped first."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    return [n.value for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _texts() -> dict[str, str]:
    """Every place a citation may stand, as ``{where: text}``."""
    texts = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            source = "".join(cell["source"])
            text = source if cell["cell_type"] == "markdown" else "\n".join(_strings(source))
            texts[f"{path.name} cell {i}"] = text
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if path != REFERENCES:
            texts[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    for folder in ("minillm", "exercises", "solutions"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            texts[str(path.relative_to(ROOT))] = "\n".join(_strings(path.read_text(encoding="utf-8")))
    return texts


def _entries() -> dict[str, str]:
    """``{key: its entry's text}``, in file order."""
    text = REFERENCES.read_text(encoding="utf-8")
    heads = list(ENTRY.finditer(text))
    keys = [m.group(1) for m in heads]
    assert len(keys) == len(set(keys)), f"a key has two entries: {sorted(k for k in keys if keys.count(k) > 1)}"
    ends = [m.start() for m in heads[1:]] + [len(text)]
    return {m.group(1): text[m.end() : end] for m, end in zip(heads, ends)}


@pytest.fixture(scope="module")
def cited() -> dict[str, list[str]]:
    """``{key: [where it is cited]}``."""
    found: dict[str, list[str]] = {}
    for where, text in _texts().items():
        for key in CITATION.findall(text):
            found.setdefault(key, []).append(where)
    return found


def test_every_cited_key_has_an_entry(cited):
    entries = _entries()
    unknown = {key: where[:3] for key, where in cited.items() if key not in entries}
    assert not unknown, f"cited but not in docs/references.md (add an entry, or mend the key): {unknown}"


def test_every_entry_is_cited_somewhere(cited):
    unused = [key for key in _entries() if key not in cited]
    assert not unused, f"entries nothing cites (cite each where its fact is stated, or drop it): {unused}"


@pytest.mark.parametrize("key", list(_entries()))
def test_an_entry_gives_its_source_and_quotes_it(key):
    entry = _entries()[key]
    assert re.search(r"<https?://[^>\s]+>", entry), f"[{key}]: the entry gives no address (<https://...>) of its source"
    quotes = [line for line in entry.splitlines() if line.lstrip().startswith(">")]
    assert quotes, f"[{key}]: the entry quotes no passage (a line starting with '>') for the claims that cite it"
