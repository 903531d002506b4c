"""``minillm grade --submissions DIR``: grade a whole class into one table, written as CSV and JSON.

``DIR`` holds one entry per student, named after the student: a folder, or a ``.zip``, with the
student's ``chNN_*.py`` files directly in it or under ``exercises/`` (or inside one top folder).
Each student is graded like ``minillm grade --impl FOLDER``: one grader per chapter, learner code in
processes of its own, every chapter within its time limit. So a student whose code does not compile,
hangs, or kills its own process gets a row with what it earned, and the run goes on to the next.

A zip is never extracted as it is: only files named ``chNN_*.py`` at most two folders deep are read,
each at most ``MAX_FILE_BYTES``, and written under their bare name into a fresh folder, so no
member's path (``../../.bashrc``, ``/etc/...``, a symlink) decides where anything is written.
"""

from __future__ import annotations

import csv
import json
import re
import sys
import tempfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from minillm.course.grading import check_seconds, grade, versions

CODE_FILE = re.compile(r"ch[0-9][0-9]_[A-Za-z0-9_]+\.py")
MAX_FILE_BYTES = 1 << 20
SYMLINK = 0o120000


def student_entries(folder: Path) -> list[tuple[str, Path]]:
    """``(student id, folder or zip)`` for every submission in ``folder``, sorted by id."""
    if not Path(folder).is_dir():
        raise ValueError(f"--submissions must be a folder of student folders or zips; got {folder}")
    entries = [p for p in sorted(Path(folder).iterdir()) if not p.name.startswith((".", "_"))]
    return [(p.stem if p.suffix == ".zip" else p.name, p) for p in entries if p.is_dir() or p.suffix == ".zip"]


def extract_code(archive: Path, dest: Path) -> Path:
    """Write the ``chNN_*.py`` files of a zip into ``dest`` under their bare names; return ``dest``.

    Members deeper in the archive lose to shallower ones of the same name (``ch04_x.py`` beats
    ``exercises/ch04_x.py``). Raises ``ValueError`` for an unreadable zip or one with no such file."""
    try:
        with zipfile.ZipFile(archive) as z:
            members = [m for m in z.infolist() if _is_code(m)]
            for m in sorted(members, key=lambda m: -len(PurePosixPath(m.filename).parts)):  # shallowest written last
                with z.open(m) as src:
                    data = src.read(MAX_FILE_BYTES + 1)
                if len(data) <= MAX_FILE_BYTES:
                    (dest / PurePosixPath(m.filename).name).write_bytes(data)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, OSError, RuntimeError) as err:
        raise ValueError(f"cannot read {archive.name}: {err}") from None
    if not any(dest.glob("ch[0-9][0-9]_*.py")):
        raise ValueError(f"no chNN_*.py files in {archive.name}")
    return dest


def _is_code(member: zipfile.ZipInfo) -> bool:
    parts = PurePosixPath(member.filename.replace("\\", "/")).parts
    return (
        not member.is_dir()
        and 1 <= len(parts) <= 3
        and ".." not in parts
        and not member.filename.startswith("/")
        and CODE_FILE.fullmatch(parts[-1]) is not None
        and (member.external_attr >> 16) & 0o170000 != SYMLINK
        and member.file_size <= MAX_FILE_BYTES
    )


def grade_student(
    student: str, entry: Path, chapters, timeout: float, chapter_timeout: float | None, root: Path
) -> dict:
    """One row of the class table: the student's points per chapter and the full report, or the
    reason nothing could be graded."""
    try:
        with tempfile.TemporaryDirectory(prefix="minillm-submission-") as tmp:
            code = extract_code(entry, Path(tmp)) if entry.suffix == ".zip" else entry
            report = grade(chapters, str(code), timeout, root, chapter_timeout, student)
    except ValueError as err:
        return {
            "student": student,
            "chapters": {},
            "points": 0.0,
            "problems": [str(err)],
            "report": None,
            "tampered": [],
        }
    return {
        "student": student,
        "chapters": {run.chapter: run.points for run in report.runs},
        "points": report.points,
        "problems": [f"{run.chapter}: {p}" for run in report.runs for p in run.problems],
        "report": report.to_json(),
        "tampered": report.tampered,
    }


def grade_submissions(
    folder: Path, chapters, out: Path, timeout: float, chapter_timeout: float | None, root: Path
) -> int:
    """Grade every student in ``folder``; print the table, write ``out``.csv and ``out``.json."""
    check_seconds("timeout", timeout)  # once, not once per student's row
    if chapter_timeout is not None:
        check_seconds("chapter_timeout", chapter_timeout)
    if (Path(root) / "solutions").is_dir():
        print(
            f"minillm grade: warning: {Path(root) / 'solutions'} holds the reference answers, which a student's code "
            "can read by their path (it cannot import them): for marks that count, grade from a `minillm make-release` "
            "copy",
            file=sys.stderr,
        )
    rows = []
    for student, entry in student_entries(folder):
        print(f"grading {student} ...", flush=True)
        rows.append(grade_student(student, entry, chapters, timeout, chapter_timeout, root))
        if rows[-1].get("tampered"):  # every later student would be graded by rewritten code
            print(
                f"minillm grade: stopped after {student}, whose code changed the course's files: "
                f"{', '.join(rows[-1]['tampered'])}; restore them (e.g. git checkout) and grade the rest again",
                file=sys.stderr,
            )
            break
    max_points = {}
    for row in rows:
        for run in (row["report"] or {}).get("chapters", []):
            max_points.setdefault(run["chapter"], run["max_points"])
    total = sum(max_points.values())
    header = ["student", *max_points, "points", "max_points", "problems"]
    table = [
        [
            row["student"],
            *(row["chapters"].get(c, 0.0) for c in max_points),
            row["points"],
            total,
            "; ".join(row["problems"]),
        ]
        for row in rows
    ]
    csv_path, json_path = Path(f"{out}.csv"), Path(f"{out}.json")
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([header, *table])
    summary = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": versions(),
        "max_points": {**max_points, "total": total},
        "students": rows,
    }
    json_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False), encoding="utf-8")
    print(_format(header, table))
    print(f"wrote {csv_path} and {json_path}")
    return 1 if rows and rows[-1].get("tampered") else 0


def _format(header: list[str], table: list[list]) -> str:
    cells = [header, *[[f"{c:g}" if isinstance(c, float) else str(c) for c in row] for row in table]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(row, widths)), row[-1]]).rstrip() for row in cells)
