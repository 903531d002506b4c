"""Fixtures shared by the unit tests: the models, loaded once per session, and an engine factory
that runs any engine on a model already loaded.

The grading tests (``tests/grading``) never see these: the grader stops pytest's conftest search at
their folder, so a grading test runs the same in a learner's grader process as here.
"""

from __future__ import annotations

import pytest

from minillm import LLM
from tests.hf_models import save_chat_llama

# The files whose tests take longest (seconds each, grader processes and downloads), longest first.
LONGEST_FIRST = (
    "tests/test_notebooks.py",
    "tests/test_course.py",
    "tests/test_smollm2.py",
    "tests/test_grader_classroom.py",
    "tests/test_tensor_parallel.py",
    "tests/test_grader_security.py",
    "tests/test_browser.py",
    "tests/test_triton_aot.py",
    "tests/test_grading_catches_mistakes.py",
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's hook, which reads the xdist_group marks
def pytest_collection_modifyitems(items):
    """The longest tests first, the notebooks before all: in ``pytest -n 2`` the notebooks' worker
    starts on them at once while the other worker's tests, which take longer, keep the second core
    busy for all of them; and the two workers end together on short tests rather than one waiting
    for the other's last long one (``--no-loadscope-reorder`` keeps this order).

    A module's tests that share a module-scoped fixture (a learner process, a server, a model) are
    one xdist group, so one worker builds it once, not each worker its own."""

    def rank(item):
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    for item in items:
        if _shares_a_module_fixture(item) and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=rank)  # stable: within a file, the file's own order


def _shares_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # pytest's record of the fixtures a test uses
    return info is not None and any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


@pytest.fixture(scope="session")
def tiny() -> LLM:
    """The built-in "tiny" model in float32 on the CPU, with the naive engine."""
    return LLM("tiny", dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tiny64() -> LLM:
    """ "tiny" in float64: engines compared token for token agree exactly."""
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


@pytest.fixture(scope="session")
def engine_on():
    """``engine_on(llm, "paged", block_size=4)``: that engine on ``llm``'s loaded weights (the paged
    engines attend with the PyTorch reference unless told otherwise, on any device)."""

    def build(llm: LLM, engine: str, **options) -> LLM:
        if engine in ("paged", "chunked"):
            options.setdefault("attention_backend", "torch")
        return LLM(llm, engine=engine, **options)

    return build
