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


def png_outputs(nb) -> int:
    """How many pictures the run left in the notebook (a widget's still included)."""
    return sum("image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", []))


def run_notebooks(out_dir: Path, budget_s: float, pattern: str = "*.ipynb", per_notebook_s: float = 120) -> list:
    """Run the notebooks matching ``pattern`` in order within ``budget_s``; write each executed copy to
    ``out_dir`` (its ``metadata.minillm`` says where and how it ran) and return one row per notebook."""
    import nbformat

    out_dir.mkdir(parents=True, exist_ok=True)
    machine, versions, deadline, rows = machine_label(), versions_label(), time.monotonic() + budget_s, []
    for notebook in sorted(NOTEBOOK_DIR.glob(pattern)):
        left = deadline - time.monotonic()
        if left < MIN_START_S:
            rows.append({"notebook": notebook.name, "status": "not run", "why": f"{left:.0f} s of budget left"})
            continue
        nb = nbformat.read(notebook, as_version=4)
        start, row = time.perf_counter(), {"notebook": notebook.name, "title": chapter_title(nb)}
        try:
            execute(nb, cwd=notebook.parent, timeout=int(min(per_notebook_s, left)))  # nbclient's limit is per cell
            row["status"] = "ok"
        except Exception as err:  # nbclient's CellExecutionError carries the cell's traceback
            row["status"], row["error"] = "error", f"{type(err).__name__}: {str(err)[-ERROR_CHARS:]}"
        row["seconds"] = round(time.perf_counter() - start, 1)
        row["pictures"] = png_outputs(nb)
        nb.metadata["minillm"] = {
            "source": notebook.name,
            "source-sha256": source_sha256(notebook),
            "title": row["title"],
            "built": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "runtime-s": f"{row['seconds']:.0f}",
            "machine": machine,
            "mode": "small mode (MINILLM_SMALL=1)",
            "versions": versions,
            "status": row["status"],
        }
        nbformat.write(nb, out_dir / notebook.name)
        rows.append(row)
    return rows
