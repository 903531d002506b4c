"""What a grading run found: one ``Result`` per test, one ``ChapterRun`` per grader process, and the
``Report`` that prints them as a score table or as JSON for a classroom's tooling."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

MARKS = {"passed": "✓", "skipped": "-"}  # every other status is a ✗
OUTPUT_LIMIT = 2000  # characters of what a test (and a call into learner code) printed that are kept


@dataclass
class Result:
    """The outcome of one grading test: passed, failed, not_implemented, delegated, timeout or skipped."""

    chapter: str
    test: str
    status: str
    message: str = ""  # the error's first line, or why the test was skipped
    hints: list[str] = field(default_factory=list)  # the test's @pytest.mark.hint ladder, the mistake first
    points: float = 1.0  # what the test is worth (@pytest.mark.points); earned only when it passes
    duration: float = 0.0  # seconds, setup + call + teardown
    output: str = ""  # what the test printed, its last characters only

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def hint(self) -> str:
        """The first rung: the mistake this test catches."""
        return self.hints[0] if self.hints else ""

    def hint_at(self, level: int) -> str:
        """Rung ``level`` (1 = the first) of the ladder, the last when there are fewer, saying so
        when more remain."""
        if not self.hints:
            return ""
        text = self.hints[min(level, len(self.hints)) - 1]
        if level < len(self.hints):
            text += f" (more: check(..., hint={level + 1}), or minillm grade --hint {level + 1})"
        return text

    @property
    def earned(self) -> float:
        return self.points if self.passed else 0.0

    def line(self, timeout: float, hint_level: int = 1) -> str:
        """One line for the score table, with rung ``hint_level`` of a failure's hint ladder; a
        failure adds its error on a second line."""
        hint = self.hint_at(hint_level)
        mark = MARKS.get(self.status, "✗")
        if self.passed:
            return f"  {mark} {self.test}"
        if self.status == "skipped":
            return f"  {mark} {self.test}: skipped ({self.message}), counts as not passed"
        if self.status == "not_implemented":
            return f"  {mark} {self.test}: not implemented yet"
        if self.status == "delegated":  # the test's hint is about a mistake; this is not one
            return f"  {mark} {self.test}: {self.message}"
        if self.status == "timeout":
            why = self.message or f"timed out after {timeout:g} s"
            return f"  {mark} {self.test}: {why}" + (f". Hint: {hint}" if hint else "")
        if not hint:
            return f"  {mark} {self.test}: {self.message or 'failed'}"
        return f"  {mark} {self.test}: {hint}" + (f"\n      {self.message}" if self.message else "")


@dataclass
class ChapterRun:
    """One grader process: the results of one chapter's tests, and what went wrong around them."""

    chapter: str
    results: list[Result] = field(default_factory=list)
    duration: float = 0.0
    files: dict[str, str] = field(default_factory=dict)  # sha256 of each graded file and grading test file
    problems: list[str] = field(default_factory=list)  # e.g. the chapter time limit, forged result lines
    output: str = ""  # the end of pytest's console output: where to look when a result does not explain itself

    @property
    def points(self) -> float:
        return sum(r.earned for r in self.results)

    @property
    def max_points(self) -> float:
        return sum(r.points for r in self.results)


@dataclass
class Report:
    """All results of one grading run, in collection order. A skipped test counts as not passed."""

    impl: str
    timeout: float
    runs: list[ChapterRun] = field(default_factory=list)
    student: str | None = None
    chapter_timeout: float | None = None
    timestamp: str = ""  # UTC, ISO 8601
    versions: dict[str, str] = field(default_factory=dict)
    tampered: list[str] = field(default_factory=list)  # course files that changed during the run (grading stopped)

    @property
    def results(self) -> list[Result]:
        return [r for run in self.runs for r in run.results]

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def points(self) -> float:
        return sum(run.points for run in self.runs)

    @property
    def max_points(self) -> float:
        return sum(run.max_points for run in self.runs)

    @property
    def score(self) -> float:
        return self.points / self.max_points if self.max_points else 0.0

    def chapters(self) -> dict[str, list[Result]]:
        return {run.chapter: run.results for run in self.runs}

    def table(self, hint_level: int = 1) -> str:
        """The score table; each failure shows rung ``hint_level`` of its hint ladder."""
        lines = [f"student: {self.student}"] if self.student else []
        for run in self.runs:
            passed = sum(r.passed for r in run.results)
            lines.append(
                f"{run.chapter} ({_impl_name(self.impl)}): {passed}/{len(run.results)} passed, "
                f"{run.points:g}/{run.max_points:g} points"
            )
            lines += [r.line(self.timeout, hint_level) for r in run.results]
            lines += [f"  ! {problem}" for problem in run.problems]
            if not run.results:
                tail = "\n".join(run.output.strip().splitlines()[-30:])
                lines.append(
                    f"  No test results: pytest stopped before running any test. Its output ends with:\n{tail}"
                )
        if len(self.runs) > 1:
            lines.append(f"total: {self.passed}/{self.total} passed, {self.points:g}/{self.max_points:g} points")
        return "\n".join(lines)

    def to_json(self) -> dict:
        chapters = []
        for run in self.runs:
            passed = sum(r.passed for r in run.results)
            tests = [
                {k: v for k, v in asdict(r).items() if k != "chapter"}
                | {"hint": r.hint, "duration": round(r.duration, 3), "earned": r.earned}
                for r in run.results
            ]
            chapters.append(
                {
                    "chapter": run.chapter,
                    "points": run.points,
                    "max_points": run.max_points,
                    "passed": passed,
                    "total": len(run.results),
                    "score": run.points / run.max_points if run.max_points else 0.0,
                    "duration": round(run.duration, 3),
                    "problems": run.problems,
                    "files": run.files,
                    "tests": tests,
                }
            )
        return {
            "student": self.student,
            "impl": self.impl,
            "timestamp": self.timestamp,
            "versions": self.versions,
            "timeout": self.timeout,
            "chapter_timeout": self.chapter_timeout,
            "points": self.points,
            "max_points": self.max_points,
            "passed": self.passed,
            "total": self.total,
            "score": self.score,
            "tampered": self.tampered,
            "chapters": chapters,
        }

    def __repr__(self) -> str:  # short, so a notebook cell ending in check(...) shows one line
        score = f"{self.passed}/{self.total} passed, {self.points:g}/{self.max_points:g} points"
        return f"Report({_impl_name(self.impl)}: {score})"


def _impl_name(impl: str) -> str:
    return Path(impl).name if "/" in impl or "\\" in impl else impl


def merge(chapter: str, events: list[dict], unfinished: tuple[str, str]) -> list[Result]:
    """One result per test from a grader's events, in collection order.

    A test passed only if its call passed and it got through teardown; otherwise its first failing or
    skipped phase decides. A test collected but never finished gets ``unfinished`` (status, message):
    the run died inside it, or the chapter ran out of time."""
    results: dict[str, Result] = {}
    done: set[str] = set()
    for e in events:
        if e.get("event") == "collected":
            for t in e["tests"]:
                results[t["nodeid"]] = Result(
                    chapter, _test_name(t["nodeid"]), "", hints=list(t["hints"]), points=t["points"]
                )
        elif e.get("event") == "collect_error":
            results[e["nodeid"]] = Result(
                chapter, f"{Path(e['nodeid']).name} (collection error)", "failed", e["message"]
            )
            done.add(e["nodeid"])
        elif e.get("event") == "phase" and e["nodeid"] in results:
            r = results[e["nodeid"]]
            r.duration += e["duration"]
            r.output = e["output"] or r.output
            if not r.status and e["status"] != "passed":
                r.status, r.message = e["status"], e["message"]
            if e["when"] == "teardown":
                done.add(e["nodeid"])
    for nodeid, r in results.items():
        if not r.status:
            r.status, r.message = ("passed", "") if nodeid in done else unfinished
    return list(results.values())


def _test_name(nodeid: str) -> str:
    return nodeid.partition("::")[2] or nodeid
