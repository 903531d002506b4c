"""``minillm make-release DIR``: write the student copy of the course, without the reference answers.

The copy holds the files git tracks, less ``WITHHELD``: ``solutions/``, and the test that edits the
solutions into plausible mistakes and correct variants (its edits are answer code). Its
``exercises/`` are generated afresh from the solutions, so an instructor's own work in
``exercises/`` never ships. In the copy, grading defaults to ``exercises/``
(``grading.default_impl``), ``--impl solutions`` fails with a message (there is nothing to import),
and the course tools' tests that need the answers are skipped.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

from minillm.course.exercises import expected_files
from minillm.course.paths import REPO_ROOT

WITHHELD = ("solutions", "tests/test_grading_catches_mistakes.py")  # a folder withholds all it holds


def tracked_files(root: Path) -> list[str]:
    """The paths git tracks in ``root``, relative to it."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise ValueError(
            f"make-release copies the files git tracks, but git cannot list them in {root}: {err}"
        ) from None
    return [p for p in out.decode().split("\0") if p]


def withheld(rel: str) -> bool:
    """Is the tracked path ``rel`` (relative to the root) kept out of the student copy?"""
    return any(rel == w or rel.startswith(w + "/") for w in WITHHELD)


def make_release(dest: Path, root: Path = REPO_ROOT) -> int:
    """Copy the course to ``dest`` (which must not exist, or be empty); return how many files were written."""
    dest, root = Path(dest), Path(root)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{dest} exists and is not an empty folder")
    stubs = expected_files(root)  # before copying: a broken marker in a solution stops the release here
    written = 0
    for rel in tracked_files(root):
        if withheld(rel) or not (root / rel).is_file():  # withheld, or deleted but not yet committed
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest / rel)
        written += 1
    for path, text in stubs.items():
        target = dest / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        written += not target.exists()
        target.write_text(text)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="minillm make-release",
        description="Write a student copy of the course: every tracked file except solutions/ "
        "and the tests that hold answer code.",
    )
    parser.add_argument("dest", type=Path, help="the folder to create (it must not exist, or be empty)")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    written = make_release(args.dest, args.root)
    print(f"wrote {written} files to {args.dest} (without {', '.join(WITHHELD)}; exercises/ freshly generated)")
    return 0
