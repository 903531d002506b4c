"""How long grading each chapter takes, here and in another checkout of the course, interleaved.

The grader's runtime check (``minillm.course.runtime_check``) watches every Python function that
starts while a probe runs; issue 28 allows it at most 20% more grading time per chapter. This times
``minillm grade chNN --impl solutions`` (a fresh process per run, as an instructor runs it) in this
checkout and in ``--baseline`` (e.g. a ``git worktree`` of the commit before the check), one after
the other, ``--repeats`` times, and keeps each one's fastest run (on a shared machine slower runs
mostly measure the other jobs). Writes minillm/benchmarks/results/grade_time.json, or ``--json``.

    git worktree add /tmp/before <commit>
    python -m minillm.benchmarks.grade_time --baseline /tmp/before [--chapters ch01 ch05] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from minillm.course.paths import REPO_ROOT

RESULTS = Path(__file__).parent / "results" / "grade_time.json"


def time_grading(checkout: Path, chapter: str) -> float:
    """Wall seconds of one ``minillm grade`` run of ``chapter`` on the reference answers in ``checkout``."""
    env = os.environ | {"PYTHONPATH": str(checkout)}  # its minillm, in the grader and the learner processes
    start = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "minillm.cli", "grade", chapter, "--impl", "solutions", "--timeout", "300"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        raise RuntimeError(f"grading {chapter} in {checkout} failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout of the course")
    parser.add_argument("--chapters", nargs="*", help="default: every chapter with an exercise")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=RESULTS, help="where to write the result (default: %(default)s)")
    args = parser.parse_args(argv)
    chapters = args.chapters or sorted({p.name[:4] for p in (REPO_ROOT / "solutions").glob("ch[0-9][0-9]_*.py")})
    rows = []
    for chapter in chapters:
        runs = {"this": [], "baseline": []}
        for _ in range(args.repeats):
            runs["this"].append(time_grading(REPO_ROOT, chapter))
            runs["baseline"].append(time_grading(args.baseline.resolve(), chapter))
        this, baseline = min(runs["this"]), min(runs["baseline"])
        ratio = this / baseline
        rows.append({"chapter": chapter, "this_s": this, "baseline_s": baseline, "ratio": ratio, "runs": runs})
        print(f"{chapter}: {this:.2f} s here, {baseline:.2f} s in the baseline ({ratio:.2f}x)", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.baseline, capture_output=True, text=True)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "baseline_commit": commit.stdout.strip() or None,
        "repeats": args.repeats,
        "chapters": rows,
        "worst_ratio": max(r["ratio"] for r in rows),
    }
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"worst: {result['worst_ratio']:.2f}x; wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
