"""Every chapter in full mode, the learner's default, on this machine, one after the other: does the
course run as a learner who sets nothing runs it, and how long does each chapter take?

Each notebook runs as ``minillm publish`` runs it (nbclient, offline, the exercises as shipped), but
without ``MINILLM_SMALL``: its plan (``minillm.course.plan``) picks the model, on a CPU SmolLM2 for the
chapters whose runs take minutes with it and the tiny model for the others. A chapter that fails is
recorded with its error and the next one runs. ::

    python -m minillm.benchmarks.full_mode [--out DIR] [--notebooks GLOB]

``DIR/full_mode.json`` has one row per chapter: status, seconds, the model line the chapter printed,
its ``expect`` claims (which held), and the error of a failed run; ``DIR/notebooks`` the executed
copies. The committed run is ``results/full_mode_cpu.json``; the instructor's guide quotes its times.
``tests/test_full_mode.py`` runs it when ``MINILLM_FULL_MODE=1`` is set (opt in: 19-32 minutes
on a 2-core VM, SmolLM2 already cached).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from minillm.benchmarks.gpu_notebooks import run_notebooks
from minillm.course.publish import machine_label, versions_label

RESULTS = Path(__file__).parent / "results"
PER_CELL_S = 900  # a full-mode cell may run minutes (chapter 1's SmolLM2 timings)


def run(out: Path, pattern: str = "*.ipynb", budget_s: float = 4 * 3600) -> dict:
    """Run the chapters matching ``pattern`` in full mode; write and return the report."""
    start = time.perf_counter()
    rows = run_notebooks(out / "notebooks", budget_s, pattern, per_notebook_s=PER_CELL_S, small=False)
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine_label(),
        "versions": versions_label(),
        "mode": "full mode (MINILLM_SMALL unset, MINILLM_MODEL unset)",
        "seconds": round(time.perf_counter() - start, 1),
        "chapters": rows,
    }
    (out / "full_mode.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("full_mode_run"), help="where the report and notebooks go")
    parser.add_argument("--notebooks", default="*.ipynb", help="a glob in notebooks/ (default: every chapter)")
    args = parser.parse_args(argv)
    report = run(args.out, args.notebooks)
    for row in report["chapters"]:
        failed = [c["claim"] for c in row.get("claims") or [] if not c["holds"]]
        print(
            f"{row['notebook']:28s} {row['status']:6s} {row.get('seconds', 0):7.1f} s  {row.get('model') or ''}"
            + (f"  claims that did not hold: {failed}" if failed else "")
        )
    print(f"{report['seconds']:.0f} s in all; {args.out / 'full_mode.json'}")
    return 0 if all(r["status"] == "ok" for r in report["chapters"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
