"""Grading: one set of tests in ``tests/grading/test_chNN_*.py`` runs against any implementation.

Three kinds of process take part, so that learner code never runs where marks are recorded:

* the **orchestrator** (``minillm grade``, ``check()``, ``grade()``: this module) starts one grader
  per chapter, collects its results over an authenticated pipe (``minillm.course.channel``) and
  prints a score table, or JSON for a classroom's tooling;
* the **grader**, pytest with ``minillm.course.pytest_plugin``, runs that chapter's grading tests;
  it never imports learner code;
* **learner** processes (``minillm.course.sandbox``) import the learner's module and return only
  plain data, which the grader compares.

Plain ``pytest`` grades ``solutions/`` (``MINILLM_IMPL`` unset), so the project's own suite passes;
in a student copy of the course, which has no ``solutions/``, it grades ``exercises/``.
Each call into learner code has a time limit (``--timeout``), and each chapter has one too
(``--chapter-timeout``): past it, the grader and everything it started are killed, and the tests it
had not finished count as timed out.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import platform
import select
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from minillm.course.channel import Receiver
from minillm.course.paths import REPO_ROOT
from minillm.course.results import ChapterRun, Report, merge

IMPLS = ("exercises", "solutions")
PATTERN = "ch[0-9][0-9]_*.py"
DEFAULT_TIMEOUT = 30.0  # seconds per call into learner code (--timeout)
CONSOLE_LIMIT = 20_000  # characters of pytest's console output kept per chapter
PYTEST_CONFIGS = (
    "pytest.ini",
    ".pytest.ini",
    "pyproject.toml",
    "tox.ini",
    "setup.cfg",
)  # where pytest finds its options


def default_impl(root: Path = REPO_ROOT) -> str:
    """``MINILLM_IMPL``, else ``solutions`` in the instructors' repository and ``exercises`` in a
    student copy (``minillm make-release``), which has no ``solutions/``."""
    return os.environ.get("MINILLM_IMPL") or ("solutions" if (root / "solutions").is_dir() else "exercises")


def impl_folder(impl: str, root: Path = REPO_ROOT) -> Path:
    """The folder holding the ``chNN_*.py`` files of ``impl``: ``exercises``, ``solutions``, or a
    path to a student's submission (the files directly in it, under ``exercises/``, or in its one
    subfolder)."""
    if impl in IMPLS:
        folder = Path(root) / impl
        if not folder.is_dir():
            raise ValueError(
                f"there is no {impl}/ in {root}"
                + (" (a student copy of the course has no reference answers)" if impl == "solutions" else "")
            )
        return folder.resolve()
    folder = Path(impl)
    if not folder.is_dir():
        raise ValueError(
            f"the implementation must be exercises, solutions or a folder of chNN_*.py files; got {impl!r}"
        )
    for candidate in (folder, folder / "exercises"):
        if any(candidate.glob(PATTERN)):
            return candidate.resolve()
    subfolders = [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))]
    if len(subfolders) == 1:
        return impl_folder(str(subfolders[0]), root)
    raise ValueError(f"no chNN_*.py files in {folder} (nor in its exercises/ folder)")


def load_impl(module: str, impl: str | None = None):
    """Import ``module`` (e.g. ``"ch04_selective"``) afresh from ``impl``: ``exercises``, ``solutions``
    or a folder of ``chNN_*.py`` files; by default ``MINILLM_IMPL`` (see ``default_impl``).

    The file is imported by its path, so no other copy of the course on ``sys.path`` can stand in
    for it, and anew on every call, so a notebook that calls this again sees the learner's latest
    edits. A submission's module gets a name of its own (``submission_<hash>.<module>``)."""
    impl = impl or default_impl()
    folder = impl_folder(impl)
    path = folder / f"{module}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no {module}.py in {folder}")
    package = impl if impl in IMPLS else "submission_" + hashlib.sha256(str(folder).encode()).hexdigest()[:12]
    name = f"{package}.{module}"
    sys.modules.pop(name, None)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # before running it, as a normal import does (dataclasses look themselves up there)
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def chapter_name(name: str) -> str:
    """``"1"``, ``"01"`` and ``"ch01"`` all name chapter ``"ch01"``."""
    return f"ch{int(name):02d}" if name.isdigit() else name


def find_test_files(chapters, root: Path = REPO_ROOT) -> dict[str, list[Path]]:
    """``{chapter: its grading test files}`` for ``chapters`` (every chapter when empty). A chapter
    may also be one exercise module of a chapter (``"ch05_kernel"``): its one test file."""
    folder = Path(root) / "tests" / "grading"
    if not folder.is_dir():
        raise FileNotFoundError(
            f"no grading tests at {folder}: grade from a source checkout installed with `pip install -e .`"
        )
    found: dict[str, list[Path]] = {}
    if not chapters:
        for path in sorted(folder.glob("test_ch[0-9][0-9]_*.py")):
            found.setdefault(path.name.split("_")[1], []).append(path)
        return found
    for chapter in map(chapter_name, chapters):
        one_module = folder / f"test_{chapter}.py"  # "ch05_kernel": one exercise module of a chapter
        found[chapter] = [one_module] if one_module.is_file() else sorted(folder.glob(f"test_{chapter}_*.py"))
        if not found[chapter]:
            raise ValueError(f"no grading tests for {chapter!r} in {folder}")
    return found


def grade(
    chapters=(),
    impl: str = "exercises",
    timeout: float = DEFAULT_TIMEOUT,
    root: Path = REPO_ROOT,
    chapter_timeout: float | None = None,
    student: str | None = None,
) -> Report:
    """Grade ``impl`` (``exercises``, ``solutions`` or a submission's folder) on ``chapters``, one grader
    process per chapter. ``timeout``: seconds per call into learner code; ``chapter_timeout``: seconds
    per chapter (default: ten times ``timeout``)."""
    root = Path(root)
    check_seconds("timeout", timeout)
    chapter_timeout = 10 * timeout if chapter_timeout is None else check_seconds("chapter_timeout", chapter_timeout)
    folder = impl_folder(impl, root)
    if student is None and impl not in IMPLS:
        student = Path(impl).name
    report = Report(
        impl,
        timeout,
        student=student,
        chapter_timeout=chapter_timeout,
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        versions=versions(),
    )
    before = course_fingerprint(root)
    for chapter, files in find_test_files(chapters, root).items():
        run = run_chapter(chapter, files, folder, timeout, chapter_timeout, root)
        report.runs.append(run)
        after = course_fingerprint(root)
        report.tampered = sorted({path for path in before.keys() | after.keys() if before.get(path) != after.get(path)})
        if report.tampered:  # the next grader would run rewritten code: stop here
            run.problems.append(
                f"the course's own files changed while this chapter was graded ({', '.join(report.tampered[:3])}"
                f"{', ...' if len(report.tampered) > 3 else ''}): no test of this chapter counts, and grading "
                "stopped; restore the files (e.g. git checkout) before grading again"
            )
            _void(run, "the course's files were changed during the run")
            break
    return report


def check_seconds(name: str, value) -> float:
    """``value`` if it is a finite number of seconds above 0; else a ValueError naming ``name``
    (0 or NaN would otherwise pass for "no limit", or stop everything at once)."""
    if not is_seconds(value):
        raise ValueError(f"{name} must be a number of seconds above 0, got {value!r}")
    return float(value)


def is_seconds(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def course_fingerprint(root: Path) -> dict[str, str]:
    """sha256 of what every grader runs or reads: the minillm package, the grading tests, every
    ``conftest.py`` under ``root`` and pytest's configuration files. Learner code could rewrite or
    add them on disk to change how the next chapter, or the next student, is graded. A file that
    appears counts as a change, since the fingerprint lists every candidate that exists."""
    root = Path(root)
    package = Path(__file__).resolve().parents[1]
    files = sorted(package.rglob("*.py")) + sorted((root / "tests" / "grading").glob("*.py"))
    files += [folder / name for folder in (root, root / "tests", root / "tests" / "grading") for name in PYTEST_CONFIGS]
    files += _conftests(root)
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


def _conftests(root: Path) -> list[Path]:
    """Every ``conftest.py`` under ``root``, but in hidden folders (``.git``, ``.venv``: pytest never
    collects there, and a virtual environment holds thousands of files)."""
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") and d != "__pycache__")
        if "conftest.py" in names:
            found.append(Path(folder) / "conftest.py")
    return found


def _void(run: ChapterRun, why: str) -> None:
    """No pass of ``run`` counts: its results cannot be trusted."""
    for r in run.results:
        if r.passed:
            r.status, r.message = "failed", why


def run_chapter(
    chapter: str, test_files: list[Path], folder: Path, timeout: float, chapter_timeout: float, root: Path
) -> ChapterRun:
    """Run one grader process on ``test_files`` against the code in ``folder``, within ``chapter_timeout``."""
    one_module = folder / f"{chapter}.py"  # a chapter's one exercise module ("ch05_kernel"), or all of them
    graded = [one_module] if one_module.is_file() else sorted(folder.glob(f"{chapter}_*.py"))
    run = ChapterRun(chapter, files={**file_hashes(graded, folder.parent), **file_hashes(test_files, root)})
    channel = Receiver()
    env = {**os.environ, **channel.env, "MINILLM_IMPL": str(folder), "MINILLM_GRADE_TIMEOUT": f"{timeout:g}"}
    # pytest-timeout is a backstop for the grader's own code: a test may make several calls, and its
    # first call also starts the learner's process. No conftest.py above the grading tests is loaded
    # and no addopts from a configuration file apply: a learner's code could have written them. Nor
    # are the installed plugins loaded, only the two named: the grading tests need no other, and
    # loading every one (hypothesis, xdist, ...) made each chapter's start 1.2 s slower (3.2 -> 2.0 s).
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *map(str, test_files),
        "-q",
        "-p",
        "minillm.course.pytest_plugin",
        "-p",
        "pytest_timeout",
        "-p",
        "no:cacheprovider",
        f"--confcutdir={Path(root) / 'tests' / 'grading'}",
        "-o",
        "addopts=",
        "--continue-on-collection-errors",
        f"--timeout={2 * timeout + 30:g}",
    ]
    if not graded:  # nothing to run: collect the tests only, to report what the chapter is worth
        cmd.append("--collect-only")
    start = time.monotonic()
    with tempfile.TemporaryFile() as console:
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            pass_fds=channel.child_fds,
            start_new_session=True,
        )
        channel.child_started()
        finished = _collect(proc, channel, start + chapter_timeout)
        if not finished:
            kill_tree(proc.pid)
        proc.wait()
        channel.read_available()
        channel.close()
        run.output = read_tail(console, CONSOLE_LIMIT)
    run.duration = time.monotonic() - start
    if not graded:
        unfinished = ("failed", f"no {chapter}_*.py in {folder}")
    elif finished:
        unfinished = ("failed", "no result: the test run stopped inside or before this test (see pytest's output)")
    else:
        unfinished = ("timeout", f"the chapter's time limit ({chapter_timeout:g} s) ran out before this test finished")
        run.problems.append(f"the chapter's time limit ({chapter_timeout:g} s) ran out: the grader was stopped")
    run.results = merge(chapter, channel.events, unfinished)
    if channel.forged:
        run.problems.append(f"{channel.forged} forged result lines rejected")
    # pytest ran to its end (exit status 0 or 1) yet its last line, "end", never came: lines read
    # away after the last one received leave no gap in the numbers
    lost_end = finished and proc.returncode in (0, 1) and not any(e.get("event") == "end" for e in channel.events)
    if channel.missing() or lost_end:
        run.problems.append(
            f"{channel.missing() or 'the last'} result lines went missing (read away by another process): "
            "no test of this chapter counts"
        )
        _void(run, "the chapter's results were tampered with")
    return run


def _collect(proc: subprocess.Popen, channel: Receiver, deadline: float) -> bool:
    """Read the grader's results until it exits (True) or the deadline passes (False)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if select.select([channel.fd], [], [], min(left, 0.5))[0] and not channel.read_available():
            # end of file: the grader closed the pipe; it normally exits right after
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
                return True
            except subprocess.TimeoutExpired:
                return False
        if proc.poll() is not None:
            return True


def kill_tree(pid: int) -> None:
    """Kill process ``pid``, its process group and every process below it, each with its own group
    (learner processes start sessions of their own)."""
    for p in [pid, *_descendants(pid)]:
        for kill in (os.killpg, os.kill):
            try:
                kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, found through ``/proc`` (Linux); elsewhere, none."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = entry.read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])  # the name in parentheses may hold spaces
        children.setdefault(ppid, []).append(int(entry.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def read_tail(f, limit: int) -> str:
    """The last ``limit`` characters of file ``f`` (marked ``[...]`` when cut), reading at most
    ``4 * limit`` bytes however large it is: learner code can print gigabytes."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - 4 * limit))
    text = f.read().decode("utf-8", "replace")
    return text if len(text) <= limit else "[...] " + text[-limit:]


def file_hashes(paths, base: Path) -> dict[str, str]:
    """``{path relative to base: sha256}``: which files exactly were graded, and with which tests."""
    hashes = {}
    for path in paths:
        try:
            name = str(Path(path).resolve().relative_to(Path(base).resolve()))
        except ValueError:
            name = str(path)
        hashes[name] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return hashes


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("minillm", "torch"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "unknown"
    return found
