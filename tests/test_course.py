"""Tests of the course plumbing: exercise generation, the grader, ``check`` and ``load_impl``."""

import functools
import hashlib
import json
import shutil
import textwrap
import time
from pathlib import Path

import pytest

import minillm.course.feedback as feedback
from minillm.course import Result, check, grade, load_impl
from minillm.course.exercises import main as make_exercises
from minillm.course.exercises import out_of_date, strip_solutions
from minillm.course.grade_cli import main as grade_main
from minillm.course.paths import REPO_ROOT
from minillm.course.submissions import grade_submissions

needs_solutions = pytest.mark.skipif(
    not (REPO_ROOT / "solutions").is_dir(), reason="a student copy of the course (make-release) has no solutions/"
)


@needs_solutions
def test_exercises_are_in_sync_with_solutions():
    problems = out_of_date(REPO_ROOT)
    assert not problems, "exercises/ is out of date; run `minillm make-exercises`:\n" + "\n".join(problems)


@needs_solutions
def test_sync_check_tolerates_learner_edits_but_not_drift(tmp_path):
    shutil.copytree(REPO_ROOT / "solutions", tmp_path / "solutions")
    shutil.copytree(REPO_ROOT / "exercises", tmp_path / "exercises")
    stub = tmp_path / "exercises" / "ch01_naive.py"
    stub.write_text(
        stub.read_text().replace(
            "raise NotImplementedError(", "return None  # my attempt\n    raise NotImplementedError(", 1
        )
    )
    assert out_of_date(tmp_path) == []
    solution = tmp_path / "solutions" / "ch01_naive.py"
    solution.write_text(solution.read_text() + "\n\nNEW_CONSTANT = 1\n")
    assert out_of_date(tmp_path) == ["exercises/ch01_naive.py was generated from an older solutions/ch01_naive.py"]


SOLUTION = '''\
def outer(x):
    """Docstring stays."""
    # BEGIN SOLUTION
    # HINT: add one
    y = x + 1
    return y
    # END SOLUTION


class Box:
    def method(self):
        if True:
            # BEGIN SOLUTION
            return "deep"
            # END SOLUTION
        return None
'''


def test_strip_solutions_keeps_indentation_and_hints():
    stub = strip_solutions(SOLUTION)
    assert 'raise NotImplementedError("add one")\n' in stub
    assert "\n            raise NotImplementedError(" in stub  # the second block's indentation
    assert "x + 1" not in stub and "deep" not in stub and "SOLUTION" not in stub and "HINT" not in stub
    assert '"""Docstring stays."""' in stub and "return None" in stub
    compile(stub, "stub", "exec")


@pytest.mark.parametrize(
    "bad",
    ["# BEGIN SOLUTION\nx = 1\n", "x = 1\n# END SOLUTION\n", "# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n"],
)
def test_strip_solutions_rejects_unbalanced_markers(bad):
    with pytest.raises(ValueError, match="SOLUTION"):
        strip_solutions(bad)


def test_make_exercises_never_overwrites_edits_silently(tmp_path, capsys):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "exercises").mkdir()
    solution, exercise = tmp_path / "solutions" / "ch99_demo.py", tmp_path / "exercises" / "ch99_demo.py"
    solution.write_text(SOLUTION)
    assert make_exercises(["--root", str(tmp_path), "--check"]) == 1  # missing
    assert make_exercises(["--root", str(tmp_path)]) == 0
    assert make_exercises(["--root", str(tmp_path), "--check"]) == 0
    solution.write_text(SOLUTION.replace("add one", "add 1"))
    assert make_exercises(["--root", str(tmp_path), "--check"]) == 1  # stale
    make_exercises(["--root", str(tmp_path)])  # an untouched stub is refreshed
    assert '"add 1"' in exercise.read_text()
    edited = exercise.read_text().replace('raise NotImplementedError("add 1")', "return x + 1")
    exercise.write_text(edited)
    solution.write_text(SOLUTION.replace("add one", "plus one"))
    make_exercises(["--root", str(tmp_path)])
    assert exercise.read_text() == edited and "kept" in capsys.readouterr().out
    make_exercises(["--root", str(tmp_path), "--force"])
    assert '"plus one"' in exercise.read_text()


@needs_solutions
def test_load_impl_picks_the_implementation_and_imports_afresh(monkeypatch, tmp_path):
    monkeypatch.setenv("MINILLM_IMPL", "exercises")
    first = load_impl("ch01_naive")
    assert first.__name__ == "exercises.ch01_naive" and first.__file__ == str(REPO_ROOT / "exercises" / "ch01_naive.py")
    assert load_impl("ch01_naive") is not first
    assert load_impl("ch01_naive", impl="solutions").__name__ == "solutions.ch01_naive"
    monkeypatch.setenv("MINILLM_IMPL", "answers")
    with pytest.raises(ValueError, match="exercises, solutions or a folder"):
        load_impl("ch01_naive")


def test_load_impl_imports_a_submission_folder_under_a_name_of_its_own(tmp_path):
    (tmp_path / "alice" / "exercises").mkdir(parents=True)
    (tmp_path / "bob").mkdir()
    (tmp_path / "alice" / "exercises" / "ch99_demo.py").write_text("WHO = 'alice'\n")
    (tmp_path / "bob" / "ch99_demo.py").write_text("WHO = 'bob'\n")
    alice, bob = load_impl("ch99_demo", str(tmp_path / "alice")), load_impl("ch99_demo", str(tmp_path / "bob"))
    assert (alice.WHO, bob.WHO) == ("alice", "bob") and alice.__name__ != bob.__name__
    assert alice.__name__.endswith(".ch99_demo") and not alice.__name__.startswith(("exercises", "solutions"))
    with pytest.raises(FileNotFoundError, match="ch98_other"):
        load_impl("ch98_other", str(tmp_path / "bob"))


@needs_solutions
def test_grader_on_solutions_passes_everything(capsys):
    assert grade_main(["ch01", "--impl", "solutions", "--timeout", "300"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "✗" not in out and out.count("✓") >= 5


SYNTHETIC = """\
import pytest

from minillm.course.sandbox import LearnerProcess


def run_spin(module):
    module.spin()


@pytest.mark.points(2)
def test_pass():
    print("x" * 5000 + "the end")


@pytest.mark.hint("one is not two", "compare the values")
def test_fail():
    assert 1 == 2, "compared the wrong things"


@pytest.mark.skip(reason="not this week")
def test_skip():
    pass


def test_todo():
    raise NotImplementedError("write me")


@pytest.mark.hint("loops must end")
def test_hang():
    with LearnerProcess("ch99_demo") as learner:
        learner.call(run_spin)
"""

LEARNER = """\
def spin():
    while True:
        try:
            while True:
                pass
        except:  # noqa: E722 -- the learner's bare except: it must not stop the time limit
            pass
"""


@pytest.fixture
def synthetic_root(tmp_path):
    (tmp_path / "tests" / "grading").mkdir(parents=True)
    (tmp_path / "tests" / "grading" / "test_ch99_demo.py").write_text(SYNTHETIC)
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "ch99_demo.py").write_text(LEARNER)
    return tmp_path


def test_grader_statuses_score_and_json(synthetic_root, capsys):
    # the chapter's own limit (default 10 × --timeout) is tested apart: here it must not stop a slow machine
    args = ["99", "--root", str(synthetic_root), "--json", "--timeout", "1", "--chapter-timeout", "120"]
    code = grade_main([*args, "--student", "ada"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    (chapter,) = data["chapters"]
    tests = {t["test"]: t for t in chapter["tests"]}
    assert chapter["chapter"] == "ch99" and {name: t["status"] for name, t in tests.items()} == {
        "test_pass": "passed",
        "test_fail": "failed",
        "test_skip": "skipped",
        "test_todo": "not_implemented",
        "test_hang": "timeout",
    }
    fail = tests["test_fail"]
    assert fail["hint"] == "one is not two" and "compared the wrong things" in fail["message"]
    assert "1 s" in tests["test_hang"]["message"] and tests["test_hang"]["duration"] >= 1
    # points: test_pass is worth 2 (@pytest.mark.points), every other test 1
    assert [(t["points"], t["earned"]) for t in tests.values()] == [(2, 2), (1, 0), (1, 0), (1, 0), (1, 0)]
    assert chapter["points"] == data["points"] == 2 and chapter["max_points"] == data["max_points"] == 6
    assert data["score"] == chapter["score"] == pytest.approx(2 / 6) and data["passed"] == 1 and data["total"] == 5
    # what a test printed is kept, but only its end
    assert tests["test_pass"]["output"].endswith("the end\n") and len(tests["test_pass"]["output"]) <= 2000
    # who, when, with what
    assert data["student"] == "ada" and data["impl"] == "exercises" and data["timestamp"].endswith("+00:00")
    assert set(data["versions"]) == {"minillm", "python", "torch"} and data["timeout"] == 1
    assert set(chapter["files"]) == {"exercises/ch99_demo.py", "tests/grading/test_ch99_demo.py"}
    sha = hashlib.sha256((synthetic_root / "exercises" / "ch99_demo.py").read_bytes()).hexdigest()
    assert chapter["files"]["exercises/ch99_demo.py"] == sha
    assert all(isinstance(t["duration"], float) for t in tests.values()) and chapter["problems"] == []


def test_grade_shows_the_hint_rung_asked_for(synthetic_root, capsys):
    args = ["99", "--root", str(synthetic_root), "--timeout", "1", "--chapter-timeout", "120"]
    grade_main(args)
    first = capsys.readouterr().out
    grade_main([*args, "--hint", "2"])
    second = capsys.readouterr().out
    assert "one is not two" in first and "one is not two" not in second and "compare the values" in second
    with pytest.raises(SystemExit):
        grade_main([*args, "--hint", "0"])
    assert "--hint: must be a whole number from 1" in capsys.readouterr().err


def test_check_prints_one_line_per_test_and_returns_counts(synthetic_root, monkeypatch, capsys):
    monkeypatch.setattr(feedback, "grade", functools.partial(feedback.grade, root=synthetic_root))
    report = check("ch99", timeout=1)
    out = capsys.readouterr().out
    assert (report.passed, report.total, report.points, report.max_points) == (1, 5, 2, 6) and len(report.results) == 5
    assert "✓ test_pass" in out and "✗ test_fail: one is not two" in out and "1 s" in out and "loops must end" in out
    assert "not implemented yet" in out and "skipped (not this week)" in out and "2/6 points" in out
    assert "xxxx" not in out  # printed output stays in the report, out of the table


def test_a_chapter_or_one_of_its_exercise_modules_is_graded():
    from minillm.course.grading import find_test_files

    every = find_test_files([])  # every chapter; each notebook's run grades its chapter's stubs (test_notebooks)
    assert set(every) == {p.name.split("_")[0] for p in (REPO_ROOT / "exercises").glob("ch[0-9][0-9]_*.py")}
    assert sum(map(len, every.values())) == len(list((REPO_ROOT / "tests" / "grading").glob("test_ch*.py")))
    whole = find_test_files(["5"])["ch05"]
    assert [p.name for p in whole] == ["test_ch05_kernel.py", "test_ch05_paged.py"]
    assert [p.name for p in find_test_files(["ch05_kernel"])["ch05_kernel"]] == ["test_ch05_kernel.py"]
    with pytest.raises(ValueError, match="no grading tests for 'ch05_kern'"):
        find_test_files(["ch05_kern"])


def test_a_hint_ladder_gives_one_rung_at_a_time():
    r = Result("ch99", "test_x", "failed", "AssertionError: 3 != 4", hints=["the mistake", "a closer look", "the idea"])
    more = "(more: check(..., hint=2), or minillm grade --hint 2)"
    assert r.line(1) == f"  ✗ test_x: the mistake {more}\n      AssertionError: 3 != 4"
    assert r.line(1, hint_level=2).startswith("  ✗ test_x: a closer look (more: check(..., hint=3), or minillm")
    assert r.line(1, hint_level=3).startswith("  ✗ test_x: the idea\n") and r.line(1, hint_level=9) == r.line(1, 3)
    assert r.hint == "the mistake"
    with pytest.raises(ValueError, match="hint must be a whole number >= 1"):
        check("ch99", hint=0)


def test_grader_reports_a_run_that_dies(tmp_path):
    (tmp_path / "tests" / "grading").mkdir(parents=True)
    (tmp_path / "tests" / "grading" / "test_ch98_crash.py").write_text(
        textwrap.dedent("""\
        import os

        def test_first():
            pass

        def test_crash():
            os._exit(3)

        def test_never_reached():
            pass
        """)
    )
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "ch98_crash.py").write_text("")
    report = grade(["ch98"], root=tmp_path)
    assert [r.status for r in report.results] == ["passed", "failed", "failed"]
    assert "stopped" in report.results[1].message and report.passed == 1


def test_chapter_time_limit_kills_the_grader_and_everything_it_started(tmp_path):
    """A grading test that hangs in the grader itself (past any per-call limit), after starting a
    process of its own: the chapter limit stops both, and the table still comes out."""
    pid_file = tmp_path / "pid"
    (tmp_path / "tests" / "grading").mkdir(parents=True)
    (tmp_path / "tests" / "grading" / "test_ch97_stuck.py").write_text(
        textwrap.dedent(f"""\
        import subprocess, sys, time

        def test_first():
            pass

        def test_stuck():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
            open({str(pid_file)!r}, "w").write(str(child.pid))
            time.sleep(120)

        def test_never_reached():
            pass
        """)
    )
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "ch97_stuck.py").write_text("")
    start = time.monotonic()
    # 10 s for the chapter: on a loaded 2-core machine the grader's processes took most of 4 s to start
    report = grade(["ch97"], root=tmp_path, timeout=60, chapter_timeout=10)
    assert time.monotonic() - start < 25
    assert [r.status for r in report.results] == ["passed", "timeout", "timeout"]
    assert "time limit (10 s)" in report.results[1].message and "time limit (10 s)" in report.table()
    assert not alive(int(pid_file.read_text()))


def alive(pid: int) -> bool:
    """Is ``pid`` running (a zombie waiting for a parent that never reaps it does not count)?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_chapter_without_its_file_fails_every_test_without_running_them(synthetic_root):
    (synthetic_root / "exercises" / "ch99_demo.py").unlink()
    report = grade(["ch99"], root=synthetic_root)
    assert report.total == 5 and report.max_points == 6 and report.points == 0
    assert {r.message for r in report.results} == {f"no ch99_*.py in {synthetic_root / 'exercises'}"}


def grade_a_tampering_chapter(root, victim):
    """A course of two chapters: chapter 98's learner code writes ``victim`` (a file every later grader
    runs) so that chapter 99's failing test would pass; returns the grading report."""
    grading, exercises = root / "tests" / "grading", root / "exercises"
    grading.mkdir(parents=True, exist_ok=True)
    exercises.mkdir(exist_ok=True)
    (grading / "test_ch98_vandal.py").write_text(
        textwrap.dedent("""\
        from minillm.course.sandbox import LearnerProcess

        def run_vandalize(module):
            module.vandalize()

        def test_vandal():
            with LearnerProcess("ch98_vandal") as learner:
                learner.call(run_vandalize)
        """)
    )
    target = grading / "test_ch99_target.py"
    target.write_text("def test_hard():\n    assert False\n")
    replacement = "def test_hard():\n    pass\n" if victim == target else "# every test passes\n"
    (exercises / "ch98_vandal.py").write_text(
        f"def vandalize():\n    open({str(victim)!r}, 'w').write({replacement!r})\n"
    )
    (exercises / "ch99_target.py").write_text("")
    return grade([], root=root, timeout=20)


def test_learner_code_that_rewrites_a_grading_test_voids_its_chapter_and_stops_grading(tmp_path):
    """Chapter 98's learner code rewrites chapter 99's grading test so that it passes: the change is
    seen after chapter 98, which then counts nothing, and chapter 99 is never graded by it."""
    target = tmp_path / "tests" / "grading" / "test_ch99_target.py"
    report = grade_a_tampering_chapter(tmp_path, target)
    assert [run.chapter for run in report.runs] == ["ch98"] and report.tampered == [str(target)]
    assert report.points == 0 and report.results[0].status == "failed" and "changed" in report.results[0].message
    assert "grading stopped" in report.table() and report.to_json()["tampered"] == [str(target)]


def test_learner_code_that_adds_a_conftest_voids_its_chapter_and_stops_grading(tmp_path):
    """A root ``conftest.py`` would run inside the next grader: writing one is tampering too."""
    conftest = tmp_path / "conftest.py"
    report = grade_a_tampering_chapter(tmp_path, conftest)
    assert [run.chapter for run in report.runs] == ["ch98"] and report.tampered == [str(conftest)]
    assert report.points == 0 and "changed" in report.results[0].message


def test_conftests_and_addopts_above_the_grading_tests_are_never_loaded(tmp_path):
    """Written before grading started (by an earlier student, say), they still change nothing."""
    (tmp_path / "tests" / "grading").mkdir(parents=True)
    (tmp_path / "tests" / "grading" / "test_ch96_plain.py").write_text("def test_plain():\n    pass\n")
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "ch96_plain.py").write_text("")
    for folder in (tmp_path, tmp_path / "tests"):
        (folder / "conftest.py").write_text("raise RuntimeError('a conftest.py above tests/grading was loaded')\n")
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "--no-such-option"\n')
    report = grade(["ch96"], root=tmp_path, timeout=20)
    assert [r.status for r in report.results] == ["passed"], report.runs[0].output


def test_a_grader_that_ends_without_its_last_line_counts_nothing(tmp_path):
    """Lines read away after the last one received leave no gap in the numbering; the missing
    ``end`` line shows them."""
    (tmp_path / "tests" / "grading").mkdir(parents=True)
    (tmp_path / "tests" / "grading" / "test_ch95_quiet.py").write_text(
        textwrap.dedent("""\
        import minillm.course.pytest_plugin as plugin

        def test_first():
            pass

        def test_silenced():
            plugin._channel = None  # from here on no line leaves the grader, as if read away
        """)
    )
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "ch95_quiet.py").write_text("")
    report = grade(["ch95"], root=tmp_path, timeout=20)
    assert report.points == 0 and any("went missing" in p for p in report.runs[0].problems), report.table()


@pytest.mark.parametrize(
    "option, value",
    [
        ("--timeout", "0"),
        ("--timeout", "-1"),
        ("--timeout", "nan"),
        ("--chapter-timeout", "0"),
        ("--chapter-timeout", "inf"),
    ],
)
def test_time_limits_must_be_positive_numbers_of_seconds(option, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        grade_main(["ch01", option, value])
    assert exit_.value.code == 2
    assert f"argument {option}: must be a number of seconds above 0, got '{value}'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options", [{"timeout": 0}, {"timeout": float("nan")}, {"chapter_timeout": 0}, {"chapter_timeout": -5.0}]
)
def test_grade_check_and_a_class_refuse_time_limits_that_are_not_positive(options, tmp_path):
    name = next(iter(options))
    with pytest.raises(ValueError, match=f"{name} must be a number of seconds above 0"):
        grade(["ch01"], **options)
    with pytest.raises(ValueError, match=f"{name} must be a number of seconds above 0"):
        check("ch01", **options)
    limits = {"timeout": 30.0, "chapter_timeout": None, **options}
    with pytest.raises(ValueError, match=f"{name} must be a number of seconds above 0"):
        grade_submissions(tmp_path, [], tmp_path / "grades", limits["timeout"], limits["chapter_timeout"], tmp_path)


def test_grader_rejects_unknown_chapters(capsys):
    assert grade_main(["ch42"]) == 2
    assert "no grading tests" in capsys.readouterr().err
