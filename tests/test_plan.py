"""minillm.course.plan: each chapter's model and dtype, decided once for every chapter, on a
device described as data (so a GPU the test machine lacks can be planned for)."""

from pathlib import Path

import pytest

from minillm.course import model_choice, plan
from minillm.course.plan import CPU_MODELS, CPU_ON_EVERY_DEVICE, Device, chapter_plan

H200 = Device("cuda", "NVIDIA H200", (9, 0))
T4 = Device("cuda", "Tesla T4", (7, 5))
CPU = Device("cpu", "CPU")
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    monkeypatch.delenv("MINILLM_MODEL", raising=False)
    monkeypatch.delenv("MINILLM_SMALL", raising=False)
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_choice, "_download_failed", None)
    monkeypatch.setattr(model_choice, "_in_hf_cache", lambda name: False)
    monkeypatch.setattr(model_choice, "_hub_reachable", lambda: False)

    def no_download(name, log=print):
        raise AssertionError("this test must not download")

    monkeypatch.setattr(model_choice, "ensure_cached", no_download)


def test_every_chapter_has_a_cpu_rule():
    chapters = {p.name.split("_")[0] for p in NOTEBOOKS.glob("*.ipynb")}
    assert set(CPU_MODELS) == chapters


def test_a_gpu_gives_every_chapter_a_real_model(monkeypatch):
    monkeypatch.setattr(model_choice, "_in_hf_cache", lambda name: name == "Qwen/Qwen3-0.6B")
    for chapter in set(CPU_MODELS) - set(CPU_ON_EVERY_DEVICE):
        p = chapter_plan(chapter, H200, download=False)
        assert (p.model, p.dtype) == ("Qwen/Qwen3-0.6B", "bfloat16"), p
        assert "NVIDIA H200" in p.line() and "bfloat16" in p.line()


@pytest.mark.parametrize("small", [False, True])
def test_a_chapter_that_runs_on_the_cpu_everywhere_plans_the_cpu_beside_a_gpu(monkeypatch, small):
    """Chapter 10's split cannot run on CUDA: on a GPU machine (small mode too, as gpu_check runs it) it
    plans the CPU, with the CPU's model and dtype, and says why."""
    if small:
        monkeypatch.setenv("MINILLM_SMALL", "1")
    monkeypatch.setattr(model_choice, "_in_hf_cache", lambda name: name == "Qwen/Qwen3-0.6B")
    p = chapter_plan("10", H200, download=False)
    assert (p.model, p.device.kind, p.dtype) == ("tiny", "cpu", "float32"), p
    assert "beside this NVIDIA H200" in p.line() and "no CUDA path" in p.line()
    assert chapter_plan("10", CPU, download=False).why == p.why.split("; on the CPU beside")[0]


def test_a_gpu_without_the_hub_falls_back_to_smollm2():
    p = chapter_plan("06", H200, download=False)
    assert p.model == "smollm2" and "a GPU runs a real model" in p.why


def test_below_compute_capability_8_the_dtype_is_float16():
    assert chapter_plan("05", T4, download=False).dtype == "float16"
    assert Device("cuda", "A100", (8, 0)).dtype == "bfloat16"


def test_on_a_cpu_each_chapter_says_which_model_and_why():
    plans = {c: chapter_plan(c, CPU, download=False) for c in CPU_MODELS}
    assert {c for c, p in plans.items() if p.model == "smollm2"} == {"00", "01", "02"}
    assert all(p.model == "tiny" and p.why.startswith("the tiny model on a CPU") for c, p in plans.items() if c > "02")
    assert all(p.dtype == "float32" and p.line().endswith(p.why) for p in plans.values())


def test_small_mode_is_tiny_on_any_device(monkeypatch):
    monkeypatch.setenv("MINILLM_SMALL", "1")
    for device in (H200, CPU):
        p = chapter_plan("09", device)
        assert p.model == "tiny" and "small mode" in p.line()


def test_the_environment_variable_wins_on_any_device(monkeypatch):
    monkeypatch.setenv("MINILLM_MODEL", "smollm2")
    assert chapter_plan("07", CPU).model == chapter_plan("07", H200).model == "smollm2"
    assert chapter_plan("07", CPU, override="tiny").model == "tiny"


def test_an_unknown_chapter_is_refused():
    with pytest.raises(ValueError, match="chapter must be one of 00, 01"):
        chapter_plan("11", CPU)


def test_the_device_here_matches_torch():
    import torch

    assert plan.Device.here().kind == ("cuda" if torch.cuda.is_available() else "cpu")
