"""The instructor's side: grading a class's submissions, the student release, and ``minillm --help``."""

import csv
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from minillm.cli import COMMANDS, main
from minillm.course.exercises import generate
from minillm.course.paths import REPO_ROOT
from tests.test_course import needs_solutions

HANG = (
    "def pack(seqs):\n    while True:\n        try:\n            pass\n        except:  # noqa: E722\n"
    "            pass\n"
)
SUICIDE = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"


@needs_solutions
def test_a_class_with_good_crashing_hanging_and_broken_submissions_gets_one_row_each(tmp_path, capsys):
    subs = tmp_path / "submissions"
    (subs / "alice" / "exercises").mkdir(parents=True)  # good, in an exercises/ folder
    (subs / "alice" / "exercises" / "ch04_selective.py").write_text(
        (REPO_ROOT / "solutions" / "ch04_selective.py").read_text()
    )
    with zipfile.ZipFile(subs / "bob.zip", "w") as z:  # kills its own process as soon as it is imported
        z.writestr("bob/ch04_selective.py", SUICIDE)
    (subs / "carol").mkdir()  # hangs, catching everything
    (subs / "carol" / "ch04_selective.py").write_text(HANG)
    (subs / "dave.zip").write_bytes(b"this is not a zip file")
    with zipfile.ZipFile(subs / "eve.zip", "w") as z:  # tries to write outside the folder it is unpacked into
        z.writestr("../../ch04_selective.py", "def pack(seqs):\n    return 'escaped'\n")
    out = tmp_path / "grades"

    assert (
        main(
            [
                "grade",
                "ch04",
                "--submissions",
                str(subs),
                "--out",
                str(out),
                "--timeout",
                "5",
                "--chapter-timeout",
                "120",  # carol is stopped by --timeout, call by call; the chapter's limit is tested in test_course
            ]
        )
        == 0
    )
    printed, warned = capsys.readouterr()
    assert "grade from a `minillm make-release` copy" in warned  # this checkout holds solutions/
    rows = list(csv.DictReader(open(f"{out}.csv", encoding="utf-8")))
    assert [r["student"] for r in rows] == ["alice", "bob", "carol", "dave", "eve"]
    by = {r["student"]: r for r in rows}
    full = float(by["alice"]["max_points"])
    assert full >= 8 and float(by["alice"]["ch04"]) == float(by["alice"]["points"]) == full, printed
    assert all(
        float(by[s]["points"]) == 0 and float(by[s]["max_points"]) == full for s in ("bob", "carol", "dave", "eve")
    )
    assert "cannot read dave.zip" in by["dave"]["problems"] and "no chNN_*.py files in eve.zip" in by["eve"]["problems"]
    escaped = [
        Path("/ch04_selective.py"),
        Path(tempfile.gettempdir()) / "ch04_selective.py",
        tmp_path / "ch04_selective.py",
    ]
    assert not any(p.exists() for p in escaped)  # eve's member ../../ch04_selective.py was never written

    data = json.loads(open(f"{out}.json", encoding="utf-8").read())
    assert data["max_points"] == {"ch04": full, "total": full} and set(data["versions"]) == {
        "minillm",
        "python",
        "torch",
    }
    students = {s["student"]: s for s in data["students"]}
    bob = students["bob"]["report"]["chapters"][0]
    assert {t["status"] for t in bob["tests"]} <= {"failed", "timeout"} and "exited" in bob["tests"][0]["message"]
    carol = students["carol"]["report"]["chapters"][0]
    stopped = [t for t in carol["tests"] if t["status"] == "timeout"]
    assert stopped and all("more than 5 s" in t["message"] for t in stopped)
    alice = students["alice"]["report"]
    assert alice["student"] == "alice" and alice["points"] == full and students["dave"]["report"] is None
    assert "alice" in printed and "dave" in printed


@pytest.mark.skipif(
    not (REPO_ROOT / ".git").exists(), reason="make-release copies what git tracks: it needs the git checkout"
)
def test_make_release_has_no_solutions_and_grades_exercises(tmp_path):
    dest = tmp_path / "course"
    assert main(["make-release", str(dest)]) == 0
    assert not (dest / "solutions").exists() and (dest / "tests" / "grading" / "test_ch04_selective.py").is_file()
    assert not (dest / "tests" / "test_grading_catches_mistakes.py").exists()  # its edits are answer code
    assert (dest / "README.md").is_file() and not (dest / ".git").exists()
    if (REPO_ROOT / "solutions").is_dir():
        stub = generate(REPO_ROOT / "solutions" / "ch04_selective.py")
        assert (dest / "exercises" / "ch04_selective.py").read_text() == stub
    assert main(["make-release", str(dest)]) == 2  # never into a folder that holds something

    env = {k: v for k, v in os.environ.items() if k != "MINILLM_IMPL"} | {"PYTHONPATH": str(dest)}

    def run(*args):
        return subprocess.run([sys.executable, *args], cwd=dest, env=env, capture_output=True, text=True, timeout=300)

    probe = run(
        "-c", "import minillm; from minillm.course.grading import default_impl; print(minillm.__file__, default_impl())"
    )
    path, impl = probe.stdout.split()
    assert path.startswith(str(dest)) and impl == "exercises", probe.stderr
    refused = run("-c", "from minillm.course import load_impl; load_impl('ch04_selective', 'solutions')")
    assert refused.returncode != 0 and "there is no solutions/" in refused.stderr
    collected = run("-m", "pytest", "--collect-only", "-q")  # the tests that need solutions/ skip, not break
    assert collected.returncode == 0 and "error" not in collected.stdout.strip().splitlines()[-1], collected.stdout[
        -3000:
    ]
    refused = run("-m", "minillm.cli", "grade", "ch04", "--impl", "solutions")
    assert (
        refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1 and "no solutions/" in refused.stderr
    )

    graded = run("-m", "minillm.cli", "grade", "ch04", "--json", "--timeout", "20")
    assert graded.returncode == 1, graded.stderr
    (chapter,) = json.loads(graded.stdout)["chapters"]
    assert {t["status"] for t in chapter["tests"]} == {"not_implemented"} and chapter["points"] == 0
    sha = hashlib.sha256((dest / "exercises" / "ch04_selective.py").read_bytes()).hexdigest()
    assert chapter["files"]["exercises/ch04_selective.py"] == sha


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert {"demo", "download", "grade", "make-exercises", "make-release", "capacity"} <= set(COMMANDS)
    for name in COMMANDS:
        assert f"  {name} " in out
    assert main(["-h"]) == 0 and capsys.readouterr().out == out
    assert main([]) == 2 and capsys.readouterr().err.strip() == out.strip()  # no command: the same help, as an error
    assert main(["fly"]) == 2  # an unknown command
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "unknown command 'fly'" in err and "--help" in err


def test_grade_help_describes_the_classroom_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["grade", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    for option in ("--impl", "--student", "--json", "--timeout", "--chapter-timeout", "--submissions", "--out"):
        assert option in out
