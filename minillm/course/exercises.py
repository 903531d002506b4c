"""Turn the reference answers in ``solutions/`` into the stubs in ``exercises/`` that learners edit.

In ``solutions/chNN_*.py`` every answer sits between two marker lines, indented like the code::

    # BEGIN SOLUTION
    # HINT: a line that nudges the learner (optional; a long hint goes on over more "# HINT:" lines)
    ...the answer...
    # END SOLUTION

Generation replaces each marked block with ``raise NotImplementedError("<hint>")`` at the same
indentation and keeps everything else, so the docstrings that explain each task reach the learner.

``exercises/`` holds the learners' work, so regeneration must never destroy it silently: every
generated file records a hash of what was generated, and ``make-exercises`` rewrites a file only if
it is missing or still exactly as generated (``--force`` overrides). ``--check`` exits 1 when a
stub was generated from an older solution: a test runs it, so the reference answers and the stubs
cannot drift apart, while a learner's edits never fail it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import textwrap
from pathlib import Path

from minillm.course.paths import REPO_ROOT

BEGIN, END, HINT = "# BEGIN SOLUTION", "# END SOLUTION", "# HINT:"
LINE_LENGTH = 120  # pyproject.toml's [tool.ruff] line-length
DEFAULT_HINT = "not implemented yet: write this part (the docstring above says what it must do)"
PATTERN = "ch[0-9][0-9]_*.py"
HASH_PREFIX = "# generated-sha256: "


def strip_solutions(source: str, name: str = "<solution>") -> str:
    """Replace each ``# BEGIN SOLUTION`` ... ``# END SOLUTION`` block by a ``raise NotImplementedError``
    whose message is the block's hint: its first lines, when they start with ``# HINT:``."""
    out, block_start, hint, indent = [], None, [], ""
    for lineno, line in enumerate(source.splitlines(keepends=True), start=1):
        text = line.strip()
        if text == BEGIN:
            if block_start is not None:
                raise ValueError(f"{name}:{lineno}: {BEGIN} inside the block opened on line {block_start}")
            block_start, hint, indent = lineno, [], line[: len(line) - len(line.lstrip())]
        elif text == END:
            if block_start is None:
                raise ValueError(f"{name}:{lineno}: {END} without {BEGIN}")
            out.append(raise_not_implemented(" ".join(hint) or DEFAULT_HINT, indent))
            block_start = None
        elif block_start is not None:
            if text.startswith(HINT) and lineno == block_start + 1 + len(hint):
                hint.append(text[len(HINT) :].strip())
        else:
            out.append(line)
    if block_start is not None:
        raise ValueError(f"{name}:{block_start}: {BEGIN} is never closed by {END}")
    return "".join(out)


def raise_not_implemented(hint: str, indent: str) -> str:
    """``raise NotImplementedError("hint")`` at ``indent``, on one line when it fits ``LINE_LENGTH``,
    else with the hint split over several (as ruff formats a long message)."""
    line = f"{indent}raise NotImplementedError({json.dumps(hint, ensure_ascii=False)})\n"
    if len(line) <= LINE_LENGTH + 1:
        return line
    inner = indent + "    "
    parts = textwrap.wrap(hint, LINE_LENGTH - len(inner) - 3, drop_whitespace=False, break_on_hyphens=False)
    strings = "".join(f"{inner}{json.dumps(p, ensure_ascii=False)}\n" for p in parts)
    return f"{indent}raise NotImplementedError(\n{strings}{indent})\n"


def generate(solution: Path) -> str:
    """The full text of the exercise file for one solution file: header, then the stripped code."""
    body = strip_solutions(solution.read_text(), solution.name)
    compile(body, solution.name, "exec")  # a marker in the wrong place must not ship a broken stub
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    header = (
        f"# Generated from solutions/{solution.name} by `minillm make-exercises`. This file is yours:\n"
        "# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.\n"
        "# make-exercises never overwrites a file you have edited (unless you pass --force).\n"
        f"{HASH_PREFIX}{digest}\n"
    )
    return header + body


def is_untouched(text: str) -> bool:
    """True when ``text`` is a generated exercise file that nobody has edited since."""
    _, _, rest = text.partition("\n" + HASH_PREFIX)
    digest, _, body = rest.partition("\n")
    return hashlib.sha256(body.encode()).hexdigest()[:16] == digest


def expected_files(root: Path) -> dict[Path, str]:
    """``{exercise path: generated text}`` for every chapter solution under ``root``."""
    return {root / "exercises" / s.name: generate(s) for s in sorted((root / "solutions").glob(PATTERN))}


def recorded_digest(text: str) -> str:
    """The hash a generated file's header records: which generation of the stubs it came from."""
    _, _, rest = text.partition("\n" + HASH_PREFIX)
    return rest.partition("\n")[0]


def out_of_date(root: Path) -> list[str]:
    """Why ``exercises/`` was not generated from today's ``solutions/``; empty when in sync.

    Files are compared by the hash in their header, not by content, so a learner's edits to an
    exercise never count as drift, while a change to a solution that was not regenerated does."""
    expected = expected_files(root)
    problems = [f"{p.relative_to(root)} is missing" for p in expected if not p.exists()]
    problems += [
        f"{p.relative_to(root)} was generated from an older solutions/{p.name}"
        for p, text in expected.items()
        if p.exists() and recorded_digest(p.read_text()) != recorded_digest(text)
    ]
    problems += [
        f"{p.relative_to(root)} has no solutions/{p.name}"
        for p in sorted((root / "exercises").glob(PATTERN))
        if p not in expected
    ]
    return problems


def write_exercises(root: Path, force: bool = False) -> list[str]:
    """Write missing and untouched stubs (every stub with ``force``); return one line per file."""
    lines = []
    for path, text in expected_files(root).items():
        rel = path.relative_to(root)
        old = path.read_text() if path.exists() else None
        if old == text:
            lines.append(f"  up to date  {rel}")
        elif old is None or force or is_untouched(old):
            path.write_text(text)
            lines.append(f"  wrote       {rel}")
        else:
            lines.append(f"  kept        {rel} (it has your edits; --force replaces it, so save your work first)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="minillm make-exercises", description="Regenerate exercises/ from solutions/."
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if exercises/ is out of date")
    parser.add_argument("--force", action="store_true", help="overwrite exercise files even if they were edited")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check:
        problems = out_of_date(args.root)
        for line in problems:
            print(f"out of date: {line}")
        if problems:
            print("run `minillm make-exercises` (add --force only if you mean to discard edits to exercises/)")
        return 1 if problems else 0
    print("\n".join(write_exercises(args.root, args.force)))
    return 0
