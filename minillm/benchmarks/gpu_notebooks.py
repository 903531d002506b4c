"""Every chapter notebook run once on this machine (a GPU, when ``gpu_check --notebooks`` runs there),
each one's executed copy kept, each one's outcome recorded: the course's first answer to "does every
chapter run on a GPU?".

The notebooks run as ``minillm publish`` runs them (``minillm.course.publish.execute``: small mode,
offline, the exercises as shipped), in place, so ``../exercises`` resolves. Small mode is the tiny
model: these runs find what breaks on a GPU, they do not yet load it. A notebook that fails is
recorded with its error and the next one runs; a notebook is started only while the budget leaves it
``MIN_START_S``, and one still running at the deadline is stopped. On a GPU several run at once
(``default_parallel``). Each picture a notebook drew is also written out as a PNG file.
``minillm publish --from DIR`` turns the executed copies into pages.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
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


def save_pictures(nb, folder: Path, stem: str) -> int:
    """Write every picture the run left in the notebook (a widget's still included) to ``folder``, as
    ``STEM-cellNN-K.png`` (the cell's index, the output's); return how many."""
    count = 0
    for i, cell in enumerate(nb.cells):
        for k, out in enumerate(cell.get("outputs", [])):
            if png := out.get("data", {}).get("image/png"):
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{stem}-cell{i:02d}-{k}.png").write_bytes(base64.b64decode(png))
                count += 1
    return count


def default_parallel() -> int:
    """How many notebooks run at once: one on a CPU (their claims are timed against one busy core at
    most, as the notebook test runs them); on a GPU, one per 4 CPU cores, at most 4, on the expectation
    (not yet measured) that a small-mode chapter there spends most of its time on the host (kernel
    start, imports, Triton compiles, the tiny model's launches). One at a time, nine chapters took
    471 s on an H200 (2026-12-04): all thirteen would not fit the notebooks' budget."""
    import torch

    if not torch.cuda.is_available():
        return 1
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def run_notebooks(
    out_dir: Path,
    budget_s: float,
    pattern: str = "*.ipynb",
    per_notebook_s: float = 120,
    small: bool = True,
    parallel: int = 1,
) -> list:
    """Run the notebooks matching ``pattern``, ``parallel`` at a time, within ``budget_s``; write each
    executed copy to ``out_dir`` (its ``metadata.minillm`` says where and how it ran) and its pictures
    to ``out_dir/pictures`` (``save_pictures``); return one row per notebook, in order, with the
    ``expect`` claims it recorded and the model line it printed. ``small=False``: full mode. At the
    deadline, a notebook still running has its kernel killed (its row says so); one not started by
    then is "not run"."""
    notebooks = sorted(NOTEBOOK_DIR.glob(pattern))
    if not notebooks:
        raise ValueError(f"no chapter notebook in {NOTEBOOK_DIR} matches {pattern!r}")
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ValueError(f"parallel must be an integer >= 1, got {parallel!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    run = _Run(out_dir, time.monotonic() + budget_s, per_notebook_s, small, parallel)
    with ThreadPoolExecutor(parallel, thread_name_prefix="notebook") as pool:
        futures = [pool.submit(run.one, notebook) for notebook in notebooks]
        try:
            while wait(futures, timeout=1.0).not_done:
                if time.monotonic() > run.deadline:
                    run.stop_all()
        except BaseException:  # an interrupt or the section's alarm: leave no kernel running behind
            run.deadline = 0.0
            run.stop_all()
            raise
    return [future.result() for future in futures]


class _Run:
    """One ``run_notebooks`` call: what every notebook's thread shares, and the kernels running now."""

    def __init__(self, out_dir: Path, deadline: float, per_notebook_s: float, small: bool, parallel: int):
        self.out_dir, self.deadline, self.per_notebook_s, self.small = out_dir, deadline, per_notebook_s, small
        self.machine, self.versions, self.parallel = machine_label(), versions_label(), parallel
        self.kernels, self.stopped, self.lock = {}, set(), threading.Lock()  # notebook name -> its KernelManager

    def stop_all(self) -> None:
        """Kill the kernel (and whatever it started: its process group) of every notebook still running."""
        with self.lock:
            for name, km in self.kernels.items():
                pgid = getattr(km.provisioner, "pgid", None) if km.has_kernel else None
                if pgid and name not in self.stopped:
                    self.stopped.add(name)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pgid, signal.SIGKILL)

    def one(self, notebook: Path) -> dict:
        """Run ``notebook`` (if the budget still allows), write its executed copy, return its row."""
        import nbformat

        left = self.deadline - time.monotonic()
        if left < MIN_START_S:
            return {"notebook": notebook.name, "status": "not run", "why": f"{left:.0f} s of budget left"}
        nb = nbformat.read(notebook, as_version=4)
        start, row = time.perf_counter(), {"notebook": notebook.name, "title": chapter_title(nb)}
        nb.cells.append(nbformat.v4.new_code_cell(CLAIMS_CELL))  # prints the run's expect record; removed below

        def started(km):
            with self.lock:
                self.kernels[notebook.name] = km

        try:
            timeout = int(min(self.per_notebook_s, left))  # per cell
            execute(nb, cwd=notebook.parent, timeout=timeout, small=self.small, started=started)
            row["status"] = "ok"
        except Exception as err:  # nbclient's CellExecutionError carries the cell's traceback
            row["status"], row["error"] = "error", f"{type(err).__name__}: {str(err)[-ERROR_CHARS:]}"
        finally:
            with self.lock:
                self.kernels.pop(notebook.name, None)
        if notebook.name in self.stopped:
            row["status"], row["error"] = "error", "stopped: the budget ran out while it ran"
        row["seconds"] = round(time.perf_counter() - start, 1)
        row["claims"] = claims(nb.cells.pop())
        row["model"] = plan_line(nb)
        row["pictures"] = save_pictures(nb, self.out_dir / "pictures", notebook.stem)
        mode = "small mode (MINILLM_SMALL=1)" if self.small else "full mode"
        nb.metadata["minillm"] = {
            "source": notebook.name,
            "source-sha256": source_sha256(notebook),
            "title": row["title"],
            "built": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "runtime-s": f"{row['seconds']:.0f}",
            "machine": self.machine,
            "mode": mode + (f", {self.parallel} notebooks at a time" if self.parallel > 1 else ""),
            "versions": self.versions,
            "status": row["status"],
        }
        nbformat.write(nb, self.out_dir / notebook.name)
        return row
