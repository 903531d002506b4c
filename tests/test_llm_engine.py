"""One engine and one KV pool for the life of an ``LLM``: every call reuses them, between calls the
pool is empty, and a call that fails or is abandoned leaves nothing behind (a frozen heap included)."""

import gc
import time

import httpx
import pytest
import torch

from minillm import LLM, SamplingParams
from minillm import llm as llm_module
from minillm.capacity import find_capacity
from minillm.server import serve_in_thread

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
PROMPTS = [[1, 2, 3], [4] * 9, [5, 6], [7] * 17]


@pytest.fixture(params=["paged", "chunked"])
def paged(tiny64, request, engine_on):
    return engine_on(tiny64, request.param, block_size=4, num_gpu_blocks=24, max_num_seqs=3)


def pool_is_empty(llm) -> bool:
    stats = llm.stats()
    return (
        stats["num_running"] == stats["num_waiting"] == 0
        and not llm.llm_engine.has_unfinished_requests()
        and stats.get("num_free_blocks") == stats.get("num_total_blocks")
        and llm.llm_engine.runner.kv_tokens() == 0
    )


def test_three_calls_reuse_one_engine_and_one_pool(tiny64, paged):
    engine, runner = paged.llm_engine, paged.llm_engine.runner
    storage = [t.untyped_storage().data_ptr() for t in runner.k_caches + runner.v_caches]
    want = [o.token_ids for o in tiny64.generate(PROMPTS, PARAMS)]
    traces = []
    for _ in range(3):
        assert [o.token_ids for o in paged.generate(PROMPTS, PARAMS)] == want
        assert paged.llm_engine is engine and paged.llm_engine.runner is runner
        assert [t.untyped_storage().data_ptr() for t in runner.k_caches + runner.v_caches] == storage
        assert pool_is_empty(paged)
        traces.append(paged.trace)
        assert paged.stats()["num_steps"] == len(paged.trace) > 0
    # each call's trace starts afresh: at step 0, its times from the call's own start
    assert all(t[0].step == 0 and t[0].start_time < 1.0 for t in traces) and len({id(t) for t in traces}) == 3


def test_another_engine_on_a_loaded_model_shares_its_weights(tiny64):
    chunked = LLM(tiny64, engine="chunked", max_num_batched_tokens=8, attention_backend="torch")
    assert chunked.model is tiny64.model and chunked.tokenizer is tiny64.tokenizer
    assert chunked.llm_engine is not tiny64.llm_engine and chunked.dtype == torch.float64
    assert [o.token_ids for o in chunked.generate(PROMPTS, PARAMS)] == [
        o.token_ids for o in tiny64.generate(PROMPTS, PARAMS)
    ]
    with pytest.raises(ValueError, match="dtype='float32': an LLM made from another LLM runs in that LLM's dtype"):
        LLM(tiny64, engine="paged", dtype="float32")
    with pytest.raises(ValueError, match="unknown engine 'nope'"):
        LLM(tiny64, engine="nope")


def test_options_are_checked_before_any_weights_load(monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded before the options were checked")

    monkeypatch.setattr(llm_module, "load_model", no_load)
    for options, words in [
        ({"block_size": 3}, "block_size must be a power of two"),
        ({"max_num_seqs": 0}, "max_num_seqs must be an integer >= 1"),
        ({"preemption_mode": "drop"}, "preemption_mode must be one of"),
        ({"attention_backend": "cuda"}, "attention_backend must be one of"),
        ({"attention_backend": "triton", "block_size": 4}, "needs block_size >= 8"),
        ({"num_gpu_blocks": 4, "kv_cache_memory_bytes": 2**20}, "at most one of"),
        ({"gpu_memory_utilization": 2}, "gpu_memory_utilization must be a fraction"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be an integer >= 1"),
        ({"swap": True}, r"does not take the option\(s\) \['swap'\]"),
        ({"scheduler_cls": "mine"}, "scheduler_cls must be a class"),
    ]:
        with pytest.raises(ValueError, match=words):
            LLM("tiny", engine="chunked", **options)
    with pytest.raises(ValueError, match="max_queue_delay must be None or a number of seconds"):
        LLM("tiny", engine="static", max_queue_delay=-1)
    with pytest.raises(ValueError, match="num_kv_tokens must be None"):
        LLM("tiny", engine="continuous", num_kv_tokens=0)


def test_a_request_that_can_never_fit_fails_the_call_before_anything_runs(paged):
    paged.generate(PROMPTS[:1], PARAMS)
    steps_before = len(paged.trace)
    with pytest.raises(ValueError, match="more than the whole pool"):
        paged.generate([[1, 2], [3] * 200, [4, 5]], PARAMS)  # the middle one needs 206 of the pool's 96 tokens
    assert pool_is_empty(paged) and len(paged.trace) == steps_before  # nothing ran, the last call's trace stays
    assert len(paged.generate(PROMPTS, PARAMS)) == len(PROMPTS)


def test_an_error_in_the_middle_of_a_call_leaves_the_pool_empty(paged, monkeypatch):
    runner = paged.llm_engine.runner
    real, calls = runner.execute_model, []

    def fails_at_step_3(plan):
        calls.append(plan)
        if len(calls) == 3:
            raise RuntimeError("the device fell over")
        return real(plan)

    monkeypatch.setattr(runner, "execute_model", fails_at_step_3)
    with pytest.raises(RuntimeError, match="fell over"):
        paged.generate(PROMPTS, PARAMS)
    assert paged.stats()["num_steps"] == 2  # the failed call's trace is kept, to look at
    assert pool_is_empty(paged)
    monkeypatch.undo()
    assert [len(o.token_ids) for o in paged.generate(PROMPTS, PARAMS)] == [6] * len(PROMPTS)
    assert pool_is_empty(paged)


def test_an_abandoned_stream_frees_its_requests_and_a_second_call_waits_for_none(paged):
    stream = paged.stream(PROMPTS, PARAMS)
    first = [next(stream) for _ in range(3)]
    assert len(first) == 3 and paged.llm_engine.has_unfinished_requests()
    with pytest.raises(RuntimeError, match="already running a call"):
        paged.generate(PROMPTS, PARAMS)
    stream.close()
    assert pool_is_empty(paged)
    assert len(paged.generate(PROMPTS, PARAMS)) == len(PROMPTS)


def test_a_server_steps_the_llms_own_engine_and_hands_it_back(tiny64, engine_on):
    llm = engine_on(tiny64, "chunked", max_num_seqs=2, num_gpu_blocks=32)
    with serve_in_thread(llm, model_name="tiny") as server:
        assert server.async_llm.engine is llm.llm_engine
        with pytest.raises(RuntimeError, match="serving HTTP requests"):
            llm.generate(PROMPTS, PARAMS)
    assert pool_is_empty(llm)  # back from the server, empty
    assert len(llm.generate(PROMPTS, PARAMS)) == len(PROMPTS)


def test_capacity_on_a_real_model_builds_one_engine(monkeypatch):
    built = []
    real = llm_module.build_engine

    def counting(name, *args, **kwargs):
        built.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(llm_module, "build_engine", counting)
    result = find_capacity(
        "chunked", ["ttft_p95=5"], model="tiny", mix="cpu chat", num_requests=8, rate_range=(1, 4), max_num_seqs=4
    )
    assert len(result.rates) >= 2 and built.count("chunked") == 1  # every rate ran on the one engine


def test_a_call_freezes_the_heap_it_found_and_hands_it_back(paged):
    """A full garbage collection inside a step stalls every stream (one took 128 ms in chapter 3's
    timed run on a 2-core CPU): while a call runs, what was alive before it is frozen; after it,
    finished or abandoned, nothing is."""
    assert gc.get_freeze_count() == 0
    seen = [gc.get_freeze_count() for _ in paged.stream(PROMPTS, PARAMS)]
    assert min(seen) > 0 and gc.get_freeze_count() == 0
    stream = paged.stream(PROMPTS, PARAMS)
    next(stream)
    assert gc.get_freeze_count() > 0
    stream.close()
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_by_its_owner_stays_frozen_after_a_call(paged):
    gc.freeze()
    try:
        paged.generate(PROMPTS, PARAMS)
        assert gc.get_freeze_count() > 0  # the call did not unfreeze what it had not frozen
    finally:
        gc.unfreeze()


def test_a_server_freezes_the_heap_while_busy_and_hands_it_back_when_idle(tiny64, engine_on, monkeypatch):
    llm = engine_on(tiny64, "chunked", max_num_seqs=2, num_gpu_blocks=32)
    during = []
    step = llm.llm_engine.step
    monkeypatch.setattr(llm.llm_engine, "step", lambda *a, **k: during.append(gc.get_freeze_count()) or step(*a, **k))
    with serve_in_thread(llm, model_name="tiny") as server:
        body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True}
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200
        deadline = time.monotonic() + 5
        while gc.get_freeze_count() and time.monotonic() < deadline:
            time.sleep(0.01)  # the engine thread unfreezes once it finds no more work
        assert during and min(during) > 0
        assert gc.get_freeze_count() == 0
