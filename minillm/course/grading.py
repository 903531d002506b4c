"""Grading: one set of tests in ``tests/grading/test_chNN_*.py`` runs against either implementation.

Plain ``pytest`` grades ``solutions/`` (``MINILLM_IMPL`` unset), so the project's own suite passes.
``minillm grade`` grades ``exercises/``, the learner's copy: it runs pytest in a subprocess (so the
learner's latest edits are imported fresh), collects one result per test through
``minillm.course.pytest_plugin``, and prints a score table, or JSON for a classroom's tooling.
Each test gets a time limit (pytest-timeout), so code that hangs costs one test, not the session.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minillm.course.paths import REPO_ROOT
from minillm.course.pytest_plugin import REPORT_ENV

IMPLS = ("exercises", "solutions")
DEFAULT_TIMEOUT = 30.0
MARKS = {"passed": "✓", "skipped": "-"}  # every other status is a ✗


def load_impl(module: str, impl: str | None = None):
    """Import ``exercises.<module>`` or ``solutions.<module>`` afresh, chosen by ``impl`` or else by
    ``MINILLM_IMPL`` (default ``solutions``). Dropping the cached module first means a notebook that
    calls this again sees the learner's latest edits."""
    impl = impl or os.environ.get("MINILLM_IMPL", "solutions")
    if impl not in IMPLS:
        raise ValueError(f"MINILLM_IMPL must be one of {', '.join(IMPLS)}, got {impl!r}")
    if str(REPO_ROOT) not in sys.path:  # a notebook runs in notebooks/; last, so pytest's rootdir wins
        sys.path.append(str(REPO_ROOT))
    name = f"{impl}.{module}"
    sys.modules.pop(name, None)
    importlib.invalidate_caches()
    return importlib.import_module(name)


@dataclass
class Result:
    """The outcome of one grading test: passed, failed, not_implemented, timeout or skipped."""

    chapter: str
    test: str
    status: str
    message: str = ""  # the error's first line, or why the test was skipped
    hint: str = ""  # from the test's @pytest.mark.hint

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def line(self, timeout: float) -> str:
        """One line for the score table; a failure adds its error on a second line."""
        mark = MARKS.get(self.status, "✗")
        if self.passed:
            return f"  {mark} {self.test}"
        if self.status == "skipped":
            return f"  {mark} {self.test}: skipped ({self.message}), counts as not passed"
        if self.status == "not_implemented":
            return f"  {mark} {self.test}: not implemented yet"
        if self.status == "timeout":
            return f"  {mark} {self.test}: timed out after {timeout:g} s" + (f". Hint: {self.hint}" if self.hint else "")
        if not self.hint:
            return f"  {mark} {self.test}: {self.message or 'failed'}"
        return f"  {mark} {self.test}: {self.hint}" + (f"\n      {self.message}" if self.message else "")


@dataclass
class Report:
    """All results of one grading run, in collection order. A skipped test counts as not passed."""

    impl: str
    timeout: float
    results: list[Result] = field(default_factory=list)
    output: str = ""  # pytest's console output: where to look when a result does not explain itself

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def score(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def chapters(self) -> dict[str, list[Result]]:
        by_chapter: dict[str, list[Result]] = {}
        for r in self.results:
            by_chapter.setdefault(r.chapter, []).append(r)
        return by_chapter

    def table(self) -> str:
        if not self.results:
            tail = "\n".join(self.output.strip().splitlines()[-30:])
            return f"No test results: pytest stopped before running any test. Its output ends with:\n{tail}"
        lines = []
        for chapter, results in self.chapters().items():
            passed = sum(r.passed for r in results)
            lines.append(f"{chapter} ({self.impl}): {passed}/{len(results)} passed")
            lines += [r.line(self.timeout) for r in results]
        if len(self.chapters()) > 1:
            lines.append(f"total: {self.passed}/{self.total} passed")
        return "\n".join(lines)

    def to_json(self) -> dict:
        chapters = []
        for chapter, results in self.chapters().items():
            passed = sum(r.passed for r in results)
            tests = [{k: v for k, v in asdict(r).items() if k != "chapter"} for r in results]
            chapters.append({"chapter": chapter, "passed": passed, "total": len(results), "score": passed / len(results), "tests": tests})
        return {"impl": self.impl, "passed": self.passed, "total": self.total, "score": self.score, "chapters": chapters}

    def __repr__(self) -> str:  # short, so a notebook cell ending in check(...) shows one line
        return f"Report({self.impl}: {self.passed}/{self.total} passed)"


def chapter_name(name: str) -> str:
    """``"1"``, ``"01"`` and ``"ch01"`` all name chapter ``"ch01"``."""
    return f"ch{int(name):02d}" if name.isdigit() else name


def find_test_files(chapters, root: Path = REPO_ROOT) -> list[Path]:
    """The grading test files of ``chapters`` (all chapters when empty)."""
    folder = root / "tests" / "grading"
    if not folder.is_dir():
        raise FileNotFoundError(f"no grading tests at {folder}: grade from a source checkout installed with `pip install -e .`")
    if not chapters:
        return sorted(folder.glob("test_ch[0-9][0-9]_*.py"))
    files = []
    for chapter in map(chapter_name, chapters):
        found = sorted(folder.glob(f"test_{chapter}_*.py"))
        if not found:
            raise ValueError(f"no grading tests for {chapter!r} in {folder}")
        files += found
    return files


def grade(chapters=(), impl: str = "exercises", timeout: float = DEFAULT_TIMEOUT, root: Path = REPO_ROOT) -> Report:
    """Run the grading tests of ``chapters`` against ``impl`` in one pytest subprocess."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    files = find_test_files(chapters, Path(root))
    with tempfile.TemporaryDirectory() as tmp:
        results_file = Path(tmp) / "results.jsonl"
        env = {**os.environ, "MINILLM_IMPL": impl, REPORT_ENV: str(results_file)}
        cmd = [sys.executable, "-m", "pytest", *map(str, files), "-q", "-p", "minillm.course.pytest_plugin",
               "-p", "no:cacheprovider", "--continue-on-collection-errors", f"--timeout={timeout:g}"]
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        entries = results_file.read_text(encoding="utf-8").splitlines() if results_file.exists() else []
    return Report(impl, timeout, _merge(json.loads(e) for e in entries), proc.stdout + proc.stderr)


def _merge(entries) -> list[Result]:
    """One result per test from the plugin's event lines: the first failure of a test (in setup, call
    or teardown) is its result; a test collected but never finished means the run died inside it."""
    results: dict[str, Result] = {}
    for e in entries:
        path, _, test = e["nodeid"].partition("::")
        chapter = Path(path).name.split("_")[1] if Path(path).name.startswith("test_ch") else Path(path).name
        old = results.get(e["nodeid"])
        if old is None or old.status in ("unfinished", "passed"):
            results[e["nodeid"]] = Result(chapter, test or f"{Path(path).name} (collection error)", e["status"] or "unfinished",
                                          e.get("message", ""), e.get("hint", ""))
    for r in results.values():
        if r.status == "unfinished":
            r.status, r.message = "failed", "no result: the test run stopped inside or before this test (see pytest's output)"
    return list(results.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minillm grade", description="Run the grading tests and print a score table.")
    parser.add_argument("chapters", nargs="*", help="chapters to grade, e.g. ch01 or 1 (default: every chapter)")
    parser.add_argument("--impl", choices=IMPLS, default="exercises", help="whose code to grade (default: exercises, yours)")
    parser.add_argument("--json", action="store_true", help="print machine-readable results instead of the table")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds each test may run (default: %(default)s)")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        report = grade(args.chapters, args.impl, args.timeout, args.root)
    except (ValueError, FileNotFoundError) as err:
        print(f"minillm grade: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2, ensure_ascii=False) if args.json else report.table())
    return 0 if report.total and report.passed == report.total else 1
