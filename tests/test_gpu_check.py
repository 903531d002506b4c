"""The GPU session's script (``python -m minillm.benchmarks.gpu_check``) in its small CPU mode: the
same code paths as on the GPU, so the script cannot rot between the rare sessions that have one."""

import json
import os
import signal
import time

import pytest

from minillm.benchmarks import gpu_check
from minillm.engines import BUILDERS
from minillm.models import fast_model
from minillm.sim import Profile


def test_small_mode_runs_every_section(tmp_path):
    report = gpu_check.run_sections(gpu_check.SMALL, tmp_path)
    sections = gpu_check.DEFAULT_SECTIONS
    statuses = {name: report[name]["status"] for name in sections}
    assert statuses == dict.fromkeys(sections, "ok"), {n: report[n].get("error") for n in sections}
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == json.loads(json.dumps(report))
    for name in ("cpu-gpu-check-small.json", "cpu-gpu-check-small.engine-steps.json"):
        assert Profile.load(tmp_path / name).model == gpu_check.SMALL.shape
    # every engine, graphs, the fast path with graphs, sampling, caching
    assert len(report["correctness"]["engines"]) == 2 * (len(BUILDERS) + 4)
    graphs = [r for r in report["correctness"]["engines"] if r["engine"] == "chunked, cuda graphs"]
    assert len(graphs) == 2 and all(r["matches_naive"] for r in graphs)
    fast = [r for r in report["correctness"]["engines"] if r["engine"] == "chunked, fast path, cuda graphs"]
    assert len(fast) == 2 and all(r["matches_naive"] and r["fast_path"] for r in fast)  # the CPU's steps here
    assert set(report["cuda_graphs"]["batch1_decode_step_ms"]) == {"eager", "graphs", "fast path + graphs"}
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


def test_notebooks_run_side_by_side_in_order_and_one_running_at_the_deadline_is_stopped(tmp_path, monkeypatch):
    """Two at a time: a sleeper (whose first cell starts a child, and whose second cell is still
    within its own time limit at the deadline) and two quick ones; the sleeper's kernel and its child
    are killed at the deadline, and its row says so."""
    import nbformat

    from minillm.benchmarks import gpu_notebooks

    folder = tmp_path / "notebooks"
    folder.mkdir()
    pid_file = tmp_path / "child.pid"
    start_child = "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    record = f"open({str(pid_file)!r}, 'w').write(str(child.pid))"
    sleeper = [f"import subprocess, sys, time\n{start_child}\n{record}\ntime.sleep(3)", "time.sleep(60)"]
    draws = "import matplotlib.pyplot as plt\nplt.plot([0, 1])\nplt.show()"  # the kernel's backend: inline PNGs
    for name, sources in (("a_sleeps", sleeper), ("b_quick", [draws]), ("c_quick", ["print('c')"])):
        cells = [nbformat.v4.new_markdown_cell(f"# {name}"), *map(nbformat.v4.new_code_cell, sources)]
        nbformat.write(nbformat.v4.new_notebook(cells=cells), folder / f"{name}.ipynb")
    monkeypatch.setattr(gpu_notebooks, "NOTEBOOK_DIR", folder)
    monkeypatch.setattr(gpu_notebooks, "MIN_START_S", 0.5)
    start = time.monotonic()
    # 20 s: time for two kernels to start and run on a loaded 2-core machine (8 s was too few there)
    rows = gpu_notebooks.run_notebooks(tmp_path / "out", 20.0, parallel=2)
    assert time.monotonic() - start < 40, "the sleeper was not stopped at the deadline"
    assert [(r["notebook"], r["status"]) for r in rows] == [
        ("a_sleeps.ipynb", "error"),
        ("b_quick.ipynb", "ok"),
        ("c_quick.ipynb", "ok"),
    ], rows
    assert rows[0]["error"] == "stopped: the budget ran out while it ran"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child}") and "zombie" not in open(f"/proc/{child}/status").read().lower():
        assert time.monotonic() < deadline, "the sleeper's child outlived its kernel"
        time.sleep(0.1)
    assert rows[1]["pictures"] == 1 and rows[2]["pictures"] == 0
    (picture,) = (tmp_path / "out" / "pictures").glob("b_quick-*.png")
    assert picture.name == "b_quick-cell01-0.png" and picture.read_bytes().startswith(b"\x89PNG")
    executed = nbformat.read(tmp_path / "out" / "b_quick.ipynb", as_version=4)
    assert executed.metadata["minillm"]["mode"].endswith("2 notebooks at a time")
    with pytest.raises(ValueError, match="parallel must be an integer >= 1, got 0"):
        gpu_notebooks.run_notebooks(tmp_path / "out", 8.0, parallel=0)


def test_the_runs_budget_skips_the_sections_it_has_no_time_for(tmp_path, monkeypatch):
    def slow(check, entry):
        time.sleep(0.3)
        entry["summary"] = "slept"

    monkeypatch.setitem(gpu_check.SECTIONS, "calibration", slow)
    monkeypatch.setattr(gpu_check, "MIN_SECTION_S", 0.2)
    report = gpu_check.run_sections(gpu_check.SMALL, tmp_path, ["calibration", "environment"], budget_s=0.4)
    assert report["calibration"]["status"] == "ok"
    assert (
        report["environment"]["status"] == "skipped" and "the run's 0 s were spent" in report["environment"]["summary"]
    )


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


@pytest.mark.parametrize(
    "option, words",
    [
        (["--notebooks-parallel", "-1"], "--notebooks-parallel must be >= 1 (0: the default), got -1"),
        (["--budget", "0"], "--budget must be a number of seconds above 0, got 0"),
        (["--budget", "nan"], "--budget must be a number of seconds above 0, got nan"),
    ],
)
def test_command_line_rejects_a_bad_budget_or_parallelism_by_name(option, words, tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--small", "--out", str(tmp_path / "out"), *option])
    assert words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_command_line_rejects_unknown_sections(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--small", "--out", "unused", "--sections", "environment,speed"])
    assert "unknown sections ['speed']" in capsys.readouterr().err


def test_a_runs_profile_is_named_for_the_gpu_it_ran_on():
    assert gpu_check.gpu_label("NVIDIA H200") == "h200"
    assert gpu_check.gpu_label("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert gpu_check.gpu_label("Tesla T4") == "tesla-t4"
    assert gpu_check.full_settings("NVIDIA H200").profile_name == "h200-qwen3-0.6b"  # the shipped profile's name
    on_h100 = gpu_check.full_settings("NVIDIA H100 80GB HBM3")
    assert on_h100.profile_name == "h100-80gb-hbm3-qwen3-0.6b" and on_h100.shipped_profile == "h200-qwen3-0.6b"
    assert gpu_check.full_settings(None) is gpu_check.FULL


def test_a_fast_path_that_fails_is_recorded_and_the_checks_after_it_still_run(tmp_path, monkeypatch):
    """As a compiler that does not suit a device's software would: the failure is in the JSON, the
    correctness section fails, and its sampling and caching checks, the graphs' timings and the bench
    (without the fast path) still run."""

    def broken(self, model, steps):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(fast_model.FastCausalLM, "__init__", broken)
    report = gpu_check.run_sections(gpu_check.SMALL, tmp_path, ["correctness", "cuda_graphs", "bench"])
    correctness, graphs, bench = report["correctness"], report["cuda_graphs"], report["bench"]
    assert correctness["status"] == "error"
    assert "fast path and graphs: RuntimeError: no compiler here" in correctness["error"]
    fast = [r for r in correctness["engines"] if r["engine"] == "chunked, fast path, cuda graphs"]
    assert [r["error"] for r in fast] == ["RuntimeError: no compiler here"] * 2
    assert sum(r["engine"] == "chunked, prefix caching" for r in correctness["engines"]) == 2  # still ran
    assert graphs["status"] == "ok" and graphs["batch1_decode_step_ms"]["fast path + graphs"].startswith("failed (")
    assert bench["status"] == "ok" and "no compiler here" in bench["left_out"]  # the rest compared without it
    assert [x.get("engine") for x in bench["report"]["systems"]][-2:] == ["chunked", "chunked:graphs"]
