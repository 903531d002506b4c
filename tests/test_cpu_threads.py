"""minillm chooses torch's CPU thread count on purpose (minillm.models.cpu_threads), and it can be overridden."""

import pytest
import torch

from minillm import LLM
from minillm.models.cpu_threads import ENV, MAX_DEFAULT_THREADS, default_num_threads, resolve_num_threads


def test_tiny_runs_on_one_thread_and_other_models_on_half_the_cores(monkeypatch):
    assert default_num_threads("tiny") == 1
    for cores, expected in ((1, 1), (2, 1), (8, 4), (64, MAX_DEFAULT_THREADS)):
        monkeypatch.setattr("os.cpu_count", lambda cores=cores: cores)
        assert default_num_threads("HuggingFaceTB/SmolLM2-135M") == expected


def test_llm_sets_torch_threads_and_the_argument_overrides_the_default(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    before = torch.get_num_threads()
    try:
        assert LLM("tiny").num_threads == 1 and torch.get_num_threads() == 1
        assert LLM("tiny", num_threads=2).num_threads == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_environment_variable_overrides_the_default_but_not_the_argument(monkeypatch):
    monkeypatch.setenv(ENV, "3")
    assert resolve_num_threads("tiny") == 3
    assert resolve_num_threads("tiny", 2) == 2


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_thread_counts_name_the_field(bad):
    with pytest.raises(ValueError, match=r"num_threads must be an integer >= 1"):
        LLM("tiny", num_threads=bad)


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(ENV, "many")
    with pytest.raises(ValueError, match=ENV):
        resolve_num_threads("tiny")
