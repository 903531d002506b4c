"""The GPU session's script (``python -m minillm.benchmarks.gpu_check``) in its small CPU mode: the
same code paths as on the GPU, so the script cannot rot between the rare sessions that have one."""

import json
import signal
import time

import pytest

from minillm.benchmarks import gpu_check
from minillm.engines import BUILDERS
from minillm.sim import Profile


def test_small_mode_runs_every_section(tmp_path):
    report = gpu_check.run_sections(gpu_check.SMALL, tmp_path)
    sections = gpu_check.DEFAULT_SECTIONS
    statuses = {name: report[name]["status"] for name in sections}
    assert statuses == dict.fromkeys(sections, "ok"), {n: report[n].get("error") for n in sections}
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == json.loads(json.dumps(report))
    for name in ("cpu-gpu-check-small.json", "cpu-gpu-check-small.engine-steps.json"):
        assert Profile.load(tmp_path / name).model == gpu_check.SMALL.shape
    assert len(report["correctness"]["engines"]) == 2 * (len(BUILDERS) + 2)  # every engine, sampling, prefix caching
    sampling = [r for r in report["correctness"]["engines"] if r["engine"] == "chunked, sampling"]
    assert len(sampling) == 2 and all(r["matches_naive"] for r in sampling)
    caching = [r for r in report["correctness"]["engines"] if r["engine"] == "chunked, prefix caching"]
    assert len(caching) == 2 and all(r["matches_naive"] and r["cached_tokens"] > 0 for r in caching)
    kinds = [row["kind"] for row in report["step_curve"]["rows"]]
    assert kinds.count("decode_step") == 4 and kinds.count("prefill") == 2
    for row in report["end_to_end"]["engines"]:
        assert set(row["simulated"]) == {"calibrated", "engine_steps"}
        assert all(sim["steps"] == row["steps"] for sim in row["simulated"].values())  # same scheduling decisions


def test_notebooks_section_keeps_each_executed_chapter_and_its_outcome(tmp_path):
    report = gpu_check.run_sections(gpu_check.SMALL, tmp_path, ["notebooks"])  # SMALL: 00_welcome alone
    rows = report["notebooks"]["rows"]
    assert [(r["notebook"], r["status"]) for r in rows] == [("00_welcome.ipynb", "ok")], rows
    executed = json.loads((tmp_path / "notebooks" / "00_welcome.ipynb").read_text())
    assert executed["metadata"]["minillm"]["status"] == "ok"
    code = [c for c in executed["cells"] if c["cell_type"] == "code"]
    assert code and all(c["execution_count"] for c in code)  # every cell ran
    assert any(c["outputs"] for c in code)


def test_a_failing_or_overrunning_section_keeps_its_partial_results_and_the_others_run(tmp_path, monkeypatch):
    if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        pytest.skip("another alarm is set (pytest-timeout?), so time_limit stands aside")

    def broken(check, entry):
        entry["rows"] = ["finished before the failure"]
        raise RuntimeError("CUDA out of memory")

    def slow(check, entry):
        for _ in range(500):  # 5 s: far past the budget below
            time.sleep(0.01)

    monkeypatch.setitem(gpu_check.SECTIONS, "calibration", broken)
    monkeypatch.setitem(gpu_check.SECTIONS, "step_curve", slow)
    monkeypatch.setitem(gpu_check.BUDGETS, "step_curve", 0.2)
    report = gpu_check.run_sections(gpu_check.SMALL, tmp_path, ["calibration", "step_curve", "environment"])
    assert report["calibration"]["status"] == "error"
    assert report["calibration"]["rows"] == ["finished before the failure"]
    assert "CUDA out of memory" in report["calibration"]["error"]
    assert report["step_curve"]["status"] == "error" and "budget" in report["step_curve"]["error"]
    assert report["step_curve"]["seconds"] < 2
    assert report["environment"]["status"] == "ok"
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # no alarm left behind


def test_command_line_rejects_unknown_sections(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--small", "--out", "unused", "--sections", "environment,speed"])
    assert "unknown sections ['speed']" in capsys.readouterr().err
