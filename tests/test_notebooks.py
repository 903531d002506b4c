"""Every notebook runs top to bottom, headless, in small mode, in under a minute.

Each ``notebooks/*.ipynb`` is executed with nbclient in a fresh kernel that runs *this* Python
interpreter (so it sees the same installed minillm), with ``MINILLM_SMALL=1``, from ``notebooks/``
as a learner's Jupyter would. The exercises are run as shipped, i.e. unimplemented: a notebook must
cope with that. Outputs are never written back: the repository keeps its notebooks clean.

A learner's laptop always has something else running, so the notebooks run with one core kept busy,
and every comparison a notebook predicts (``minillm.course.claims.expect``) must still come out as
predicted: a measurement that a busy core can turn around is not one to teach from. In the suite
(``pytest -n 2``) the busy core is the other worker's tests: the notebooks are one xdist group,
collected first (``tests/conftest.py``), so they run one after the other in one worker while the
other worker runs the rest of the suite, which lasts longer. Run alone (``-n 0``), a background
loop keeps the second core busy instead.

Run one notebook and see its runtime: ``python -m pytest tests/test_notebooks.py -n 0 -k 01 -s``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from minillm.benchmarks import cpu_threads

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402  (installed with nbclient)
from jupyter_client.manager import KernelManager  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
BUDGET_S = 60.0  # the whole notebook, kernel start included, on 2 CPU cores
CELL_TIMEOUT_S = 50  # one cell; a hung cell fails fast with its number instead of eating the budget
BUSY_CORE_MAX_S = 1800  # the background load stops by itself after this long, whatever happens
CLAIMS_CELL = "from minillm.course.claims import dump\ndump()"


pytestmark = pytest.mark.xdist_group("notebooks")


@pytest.fixture(scope="module")
def busy_core(worker_id):
    """One core kept busy for the notebook runs, as a learner's browser, editor or second kernel
    would: the other xdist worker's tests, or, run without xdist, a loop in another process, which
    ends with the tests or by itself after ``BUSY_CORE_MAX_S``."""
    if worker_id != "master":
        yield None
        return
    proc = cpu_threads.busy_core(BUSY_CORE_MAX_S)
    yield proc
    proc.kill()
    proc.wait()


def _kernel_manager(tmp_path: Path) -> KernelManager:
    """A kernel manager whose ``python3`` kernel is this interpreter, whatever kernelspecs the
    machine has installed elsewhere (a user-level ``python3`` spec could point at another Python)."""
    spec_dir = tmp_path / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (test)",
                "language": "python",
            }
        )
    )
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return KernelManager(kernel_name="python3", kernel_spec_manager=ksm)


def _kernel_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MINILLM_MODEL", None)  # small mode always uses the offline model
    env.pop("MINILLM_IMPL", None)  # check() grades exercises/, as it would for a learner
    env["MINILLM_SMALL"] = "1"
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    env["HF_HUB_OFFLINE"] = "1"  # nothing in small mode may reach for the network
    # No OMP_WAIT_POLICY or thread settings here: the kernel runs as a learner's would, and
    # minillm's own CPU thread choice (minillm.models.cpu_threads) must keep it fast beside the busy core.
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # silences a debugger warning on stderr
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["IPYTHONDIR"] = str(tmp_path / "ipython")  # no user profile or startup files
    return env


def _failure(nb, err: Exception) -> str:
    """Which cell failed and why, in a few readable lines (not the whole notebook)."""
    if isinstance(err, nbclient.exceptions.CellTimeoutError):
        return f"a cell timed out after {CELL_TIMEOUT_S} s:\n{_plain(str(err))}"
    for i, cell in enumerate(nb.cells):
        error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
        if error is not None:
            code_no = sum(1 for c in nb.cells[: i + 1] if c.get("cell_type") == "code")
            head = "\n".join("    " + line for line in cell.source.splitlines()[:8])
            trace = "\n".join(_plain("\n".join(error.get("traceback", []))).splitlines()[-25:])
            return (
                f"cell {i} (code cell {code_no}) raised {error['ename']}: {error['evalue']}\n{head}\n    ...\n{trace}"
            )
    return _plain(str(err))[-3000:]


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_small_mode(path: Path, tmp_path: Path, record_property, busy_core):
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(CLAIMS_CELL))  # reads out what the notebook predicted
    km = _kernel_manager(tmp_path)
    client = nbclient.NotebookClient(
        nb,
        km=km,
        timeout=CELL_TIMEOUT_S,
        allow_errors=False,
        record_timing=True,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    start = time.perf_counter()
    try:
        client.execute(env=_kernel_env(tmp_path), cwd=str(NOTEBOOK_DIR))
    except (nbclient.exceptions.CellExecutionError, nbclient.exceptions.CellTimeoutError) as err:
        pytest.fail(f"{path.name}: {_failure(nb, err)}", pytrace=False)
    elapsed = time.perf_counter() - start
    record_property("runtime_s", round(elapsed, 2))
    print(f"\n{path.name}: {elapsed:.1f} s in small mode; slowest cells: {_slowest_cells(nb)}")
    assert busy_core is None or busy_core.poll() is None, "the background load stopped before the notebook finished"
    assert elapsed < BUDGET_S, (
        f"{path.name} took {elapsed:.1f} s in small mode; the budget is {BUDGET_S:.0f} s ({_slowest_cells(nb)})"
    )
    failed = [c for c in _claims(nb) if not c["holds"]]
    assert not failed, f"{path.name}, with one core busy: predicted comparisons that did not hold: " + "; ".join(
        f"{c['claim']} ({c['measured']})" for c in failed
    )


def _claims(nb) -> list[dict]:
    """The notebook's ``expect`` record, printed by the cell the test appended."""
    text = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []) if o.get("output_type") == "stream")
    line = next((ln for ln in text.splitlines() if ln.startswith("MINILLM_CLAIMS ")), None)
    assert line is not None, f"the claims cell printed no record: {text[-500:]!r}"
    return json.loads(line.removeprefix("MINILLM_CLAIMS "))


def _slowest_cells(nb, n: int = 3) -> str:
    from datetime import datetime

    times = []
    for i, c in enumerate(nb.cells):
        t = c.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in t and "shell.execute_reply" in t:
            start, end = (
                datetime.fromisoformat(t[k].replace("Z", "+00:00"))
                for k in ("iopub.execute_input", "shell.execute_reply")
            )
            times.append(((end - start).total_seconds(), i))
    return ", ".join(f"cell {i} {s:.1f} s" for s, i in sorted(times, reverse=True)[:n])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_clean(path: Path):
    """No outputs or execution counts in the repository: small diffs, no stale numbers from
    someone else's machine, nothing a learner might mistake for their own results."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i
        for i, c in enumerate(nb.cells)
        if c.get("cell_type") == "code" and (c.get("outputs") or c.get("execution_count") is not None)
    ]
    assert not dirty, (
        f"{path.name}: cells {dirty} have outputs; clear them (Edit > Clear Outputs of All Cells) before committing"
    )
    code = [c for c in nb.cells if c.get("cell_type") == "code"]
    assert code and "MINILLM_SMALL" in code[0].source, f"{path.name}: the first code cell must read MINILLM_SMALL"


def test_notebook_links_reach_files_of_the_course():
    """A relative link in a notebook's text (each chapter links its exercise file) opens a file that
    exists: JupyterLab starts at the course's folder (README), so ``../exercises/...`` is in reach."""
    broken = []
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            for target in re.findall(r"\]\(([^)\s]+)\)", cell.source):
                if "://" in target or target.startswith("#"):
                    continue
                if not (path.parent / target.split("#")[0]).resolve().is_file():
                    broken.append(f"{path.name}: {target}")
    assert not broken, broken


def test_notebooks_exist():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


def test_every_check_is_followed_by_its_answer():
    """Each chapter's ``report = check(...)`` cell has a later ``show_answer(report, ...)`` cell: the
    answer appears only once the check passed, or the learner gives up."""
    problems = []
    for path in NOTEBOOKS:
        code = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        for i, source in enumerate(code):
            for report in re.findall(r"^(\w+) = check\(", source, flags=re.M):
                if not any(re.search(rf"show_answer\(\s*{report}\b", later) for later in code[i + 1 :]):
                    problems.append(f"{path.name}: {report} = check(...) has no later show_answer({report}, ...)")
    assert not problems, problems


def test_every_code_cell_compiles():
    """A syntax error fails here in a second, before a notebook's minute-long run would find it.
    (Cells are plain Python: no IPython magics or shell escapes in this course.)"""
    broken = []
    for path in NOTEBOOKS:
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type == "code":
                try:
                    compile(cell.source, f"{path.name} cell {i}", "exec")
                except SyntaxError as err:
                    broken.append(f"{path.name} cell {i}: {err}")
    assert not broken, broken
