"""Every chapter in full mode, the learner's default (``python -m minillm.benchmarks.full_mode``).

The real run is opt in: ``MINILLM_FULL_MODE=1 python -m pytest tests/test_full_mode.py -n 0`` runs
every chapter (19-32 minutes on a 2-core VM: ``results/full_mode_cpu.json``). The other tests
check the runner around a faked kernel, in seconds."""

import json
import os

import nbformat
import pytest

from minillm.benchmarks import full_mode, gpu_notebooks
from minillm.course.publish import kernel_env


def fake_execute(fail: bool = False):
    """Stands in for nbclient: prints a plan line and, at the end, the claims record."""

    def execute(nb, cwd, timeout, small, started=None):
        assert small is False, "full mode must not set MINILLM_SMALL"
        code = [c for c in nb.cells if c.cell_type == "code"]
        code[0].outputs = [nbformat.v4.new_output("stream", text="chapter 03 runs the tiny model on this CPU\n")]
        if fail:
            raise RuntimeError("a cell failed")
        record = [{"claim": "a beats b", "holds": True, "measured": "1 vs 2"}]
        code[-1].outputs = [nbformat.v4.new_output("stream", text="MINILLM_CLAIMS " + json.dumps(record) + "\n")]

    return execute


def test_the_report_keeps_each_chapters_model_line_claims_and_executed_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_notebooks, "execute", fake_execute())
    report = full_mode.run(tmp_path, "03_*.ipynb")
    (row,) = report["chapters"]
    assert row["status"] == "ok" and row["model"] == "chapter 03 runs the tiny model on this CPU"
    assert row["claims"] == [{"claim": "a beats b", "holds": True, "measured": "1 vs 2"}]
    assert json.loads((tmp_path / "full_mode.json").read_text()) == report
    executed = nbformat.read(tmp_path / "notebooks" / "03_continuous_batching.ipynb", as_version=4)
    original = nbformat.read(gpu_notebooks.NOTEBOOK_DIR / "03_continuous_batching.ipynb", as_version=4)
    assert len(executed.cells) == len(original.cells), "the claims cell is not kept"
    assert executed.metadata["minillm"]["mode"] == "full mode"


def test_a_failing_chapter_is_recorded_and_the_run_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_notebooks, "execute", fake_execute(fail=True))
    assert full_mode.main(["--out", str(tmp_path), "--notebooks", "0[34]_*.ipynb"]) == 1
    rows = json.loads((tmp_path / "full_mode.json").read_text())["chapters"]
    outcomes = [(r["notebook"][:2], r["status"], r["claims"]) for r in rows]
    assert outcomes == [("03", "error", None), ("04", "error", None)]
    assert "a cell failed" in rows[0]["error"] and "error" in capsys.readouterr().out


def test_a_glob_that_matches_no_chapter_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"no chapter notebook in .* matches '11_\*'"):
        full_mode.run(tmp_path, "11_*")
    assert not (tmp_path / "full_mode.json").exists()


def test_full_mode_unsets_small_mode_and_small_mode_sets_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_SMALL", "1")
    assert "MINILLM_SMALL" not in kernel_env(tmp_path, small=False)
    assert kernel_env(tmp_path)["MINILLM_SMALL"] == "1"


@pytest.mark.skipif(os.environ.get("MINILLM_FULL_MODE") != "1", reason="opt in: MINILLM_FULL_MODE=1 (19-32 min)")
def test_every_chapter_runs_in_full_mode_and_its_predictions_hold(tmp_path):
    report = full_mode.run(tmp_path)
    failed = {r["notebook"]: r.get("error", "") for r in report["chapters"] if r["status"] != "ok"}
    assert not failed, failed
    missed = {r["notebook"]: [c for c in r["claims"] if not c["holds"]] for r in report["chapters"]}
    assert not any(missed.values()), missed
