"""Every chapter notebook run once on this machine (a GPU, when ``gpu_check --notebooks`` runs there),
each one's executed copy kept, each one's outcome recorded: the course's first answer to "does every
chapter run on a GPU?".

The notebooks run as ``minillm publish`` runs them (``minillm.course.publish.execute``: small mode,
offline, the exercises as shipped), in place, so ``../exercises`` resolves. Small mode is the tiny
model: these runs find what breaks on a GPU, they do not yet load it. A notebook that fails is
recorded with its error and the next one runs; a notebook is started only while the budget leaves it
``MIN_START_S``. ``minillm publish --from DIR`` turns the executed copies into pages.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path

from minillm.course.publish import (
    NOTEBOOK_DIR,
    chapter_title,
    execute,
    machine_label,
    source_sha256,
    versions_label,
)

MIN_START_S = 20  # a notebook is not started with less budget left than this
ERROR_CHARS = 1500  # the end of a failing cell's traceback, as recorded
CLAIMS_CELL = "from minillm.course.claims import dump\n\ndump()"
CLAIMS_PREFIX = "MINILLM_CLAIMS "


def claims(cell) -> list[dict] | None:
    """The ``expect`` record the appended cell printed (None if the run stopped before it)."""
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    line = next((ln for ln in text.splitlines() if ln.startswith(CLAIMS_PREFIX)), None)
    return None if line is None else json.loads(line.removeprefix(CLAIMS_PREFIX))


def plan_line(nb) -> str | None:
    """The line a chapter prints about its model, if it printed one: ``ChapterPlan.line()``, chapter
    0's ``MODEL = ...`` and chapters 1 and 2's ``model 'NAME' (...)``."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            for line in out.get("text", "").splitlines():
                if re.match(r"(chapter \S+ runs |MODEL = |(section \d+: )?model ')", line):
                    return line
    return None


def png_outputs(nb) -> int:
    """How many pictures the run left in the notebook (a widget's still included)."""
    return sum("image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", []))


def run_notebooks(
    out_dir: Path, budget_s: float, pattern: str = "*.ipynb", per_notebook_s: float = 120, small: bool = True
) -> list:
    """Run the notebooks matching ``pattern`` in order within ``budget_s``; write each executed copy to
    ``out_dir`` (its ``metadata.minillm`` says where and how it ran) and return one row per notebook,
    with the ``expect`` claims it recorded and the model line it printed. ``small=False``: full mode."""
    import nbformat

    notebooks = sorted(NOTEBOOK_DIR.glob(pattern))
    if not notebooks:
        raise ValueError(f"no chapter notebook in {NOTEBOOK_DIR} matches {pattern!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    machine, versions, deadline, rows = machine_label(), versions_label(), time.monotonic() + budget_s, []
    for notebook in notebooks:
        left = deadline - time.monotonic()
        if left < MIN_START_S:
            rows.append({"notebook": notebook.name, "status": "not run", "why": f"{left:.0f} s of budget left"})
            continue
        nb = nbformat.read(notebook, as_version=4)
        start, row = time.perf_counter(), {"notebook": notebook.name, "title": chapter_title(nb)}
        nb.cells.append(nbformat.v4.new_code_cell(CLAIMS_CELL))  # prints the run's expect record; removed below
        try:
            execute(nb, cwd=notebook.parent, timeout=int(min(per_notebook_s, left)), small=small)  # per cell
            row["status"] = "ok"
        except Exception as err:  # nbclient's CellExecutionError carries the cell's traceback
            row["status"], row["error"] = "error", f"{type(err).__name__}: {str(err)[-ERROR_CHARS:]}"
        row["seconds"] = round(time.perf_counter() - start, 1)
        row["claims"] = claims(nb.cells.pop())
        row["model"] = plan_line(nb)
        row["pictures"] = png_outputs(nb)
        nb.metadata["minillm"] = {
            "source": notebook.name,
            "source-sha256": source_sha256(notebook),
            "title": row["title"],
            "built": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "runtime-s": f"{row['seconds']:.0f}",
            "machine": machine,
            "mode": "small mode (MINILLM_SMALL=1)" if small else "full mode",
            "versions": versions,
            "status": row["status"],
        }
        nbformat.write(nb, out_dir / notebook.name)
        rows.append(row)
    return rows
