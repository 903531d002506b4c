"""``minillm grade``: the command line of the grader -- one learner (``grading.grade``) or a whole
class (``--submissions``, ``submissions.grade_submissions``)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from minillm.course.grading import DEFAULT_TIMEOUT, grade, is_seconds
from minillm.course.paths import REPO_ROOT
from minillm.course.submissions import grade_submissions


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minillm grade", description="Run the grading tests and print a score table.")
    p.add_argument("chapters", nargs="*", help="chapters to grade, e.g. ch01 or 1 (default: every chapter)")
    p.add_argument(
        "--impl",
        default="exercises",
        help="whose code: exercises (default, yours), solutions, or a folder of chNN_*.py files",
    )
    p.add_argument("--student", help="the id recorded in the JSON (default: the folder's name, for a folder)")
    p.add_argument("--json", action="store_true", help="print machine-readable results instead of the table")
    p.add_argument(
        "--hint",
        type=_level,
        default=1,
        help="which rung of each failure's hint ladder to show: 1 (default) names the mistake, the last gives the idea",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        help="seconds each call into the graded code may run (default: %(default)s)",
    )
    p.add_argument("--chapter-timeout", type=_seconds, help="seconds each chapter may run (default: 10 x --timeout)")
    p.add_argument(
        "--submissions", type=Path, help="grade every student in this folder (one folder or .zip each) into one table"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("grades"),
        help="with --submissions: write OUT.csv and OUT.json (default: %(default)s)",
    )
    p.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    return p


def _seconds(text: str) -> float:
    """argparse's type for a time limit (argparse puts the option's name before the error)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not is_seconds(value):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return value


def _level(text: str) -> int:
    """argparse's type for ``--hint``: a whole number from 1."""
    if not (text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 (the first rung), got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.submissions:
            return grade_submissions(
                args.submissions, args.chapters, args.out, args.timeout, args.chapter_timeout, args.root
            )
        report = grade(args.chapters, args.impl, args.timeout, args.root, args.chapter_timeout, args.student)
    except (ValueError, FileNotFoundError) as err:
        print(f"minillm grade: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2, ensure_ascii=False) if args.json else report.table(args.hint))
    return 0 if report.total and report.passed == report.total else 1
