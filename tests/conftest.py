"""Fixtures shared by the unit tests: the models, loaded once per session, and an engine factory
that runs any engine on a model already loaded.

The grading tests (``tests/grading``) never see these: the grader stops pytest's conftest search at
their folder, so a grading test runs the same in a learner's grader process as here.
"""

from __future__ import annotations

import pytest

from minillm import LLM
from tests.hf_models import save_chat_llama


def pytest_collection_modifyitems(items):
    """The notebooks first: in ``pytest -n 2`` their worker starts on them at once, and the other
    worker's tests, which take longer, keep the second core busy for all of them."""
    items.sort(key=lambda item: item.nodeid.split("::")[0] != "tests/test_notebooks.py")


@pytest.fixture(scope="session")
def tiny() -> LLM:
    """The built-in "tiny" model in float32 on the CPU, with the naive engine."""
    return LLM("tiny", dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tiny64() -> LLM:
    """"tiny" in float64: engines compared token for token agree exactly."""
    return LLM("tiny", dtype="float64", device="cpu")


@pytest.fixture(scope="session")
def chat_llama_dir(tmp_path_factory):
    """A tiny random Llama checkpoint with a chat template (``tests.hf_models.chat_tokenizer``)."""
    path = tmp_path_factory.mktemp("chat-llama")
    save_chat_llama(path)
    return path


@pytest.fixture(scope="session")
def chat_llama(chat_llama_dir) -> LLM:
    return LLM(str(chat_llama_dir), dtype="float32", device="cpu")


@pytest.fixture
def engine_on():
    """``engine_on(llm, "paged", block_size=4)``: that engine on ``llm``'s loaded weights (the paged
    engines attend with the PyTorch reference unless told otherwise, on any device)."""

    def build(llm: LLM, engine: str, **options) -> LLM:
        if engine in ("paged", "chunked"):
            options.setdefault("attention_backend", "torch")
        return LLM(llm, engine=engine, **options)

    return build
