"""Chapter 5: the block allocator, the paged engine, preemption (recompute and swap), and its simulator twin."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm import SamplingParams, kernels, workloads
from minillm.engines import build_engine
from minillm.kv.block_manager import BlockManager
from minillm.request import Request
from minillm.sim import simulate

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7], [5] * 11, [3, 4], [7] * 17, [2]]


def _req(rid="a", prompt_len=5, max_tokens=10):
    return Request(rid, [1] * prompt_len, SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0.0)


# --- BlockManager -------------------------------------------------------------------------------


def test_blocks_are_allocated_just_in_time():
    bm = BlockManager(num_blocks=8, block_size=4)
    r = _req(prompt_len=5)
    assert bm.allocate_slots(r, 5) and bm.get_block_table("a") == [0, 1] and bm.num_free_blocks == 6
    r.num_computed_tokens = 5
    assert bm.allocate_slots(r, 1) and len(bm.get_block_table("a")) == 2  # token 6 fits block 1
    r.num_computed_tokens = 8
    assert bm.allocate_slots(r, 1) and bm.get_block_table("a") == [0, 1, 2]  # token 9 opens block 2


def test_allocation_that_does_not_fit_allocates_nothing():
    bm = BlockManager(num_blocks=3, block_size=4)
    assert bm.allocate_slots(_req("a", 8), 8)
    b = _req("b", 8)
    assert not bm.can_fit(b, 8) and not bm.allocate_slots(b, 8)
    assert bm.num_free_blocks == 1 and bm.get_block_table("b") == []


def test_free_returns_blocks_to_the_free_list_and_ref_counts_share():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = _req("a", 4)
    bm.allocate_slots(a, 4)
    bm.share_blocks("b", [0])  # prefix sharing: b reads a's first block
    assert bm.ref_counts[:2] == [2, 1]
    bm.free(a)
    assert bm.ref_counts[:2] == [1, 0] and bm.num_free_blocks == 3 and 0 not in bm.free_block_ids
    bm.free("b")
    assert bm.num_free_blocks == 4 and sorted(bm.free_block_ids) == [0, 1, 2, 3]


def test_block_manager_errors():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = _req("a", 2, max_tokens=1)
    bm.allocate_slots(a, 2)
    a.num_computed_tokens = 2
    with pytest.raises(ValueError, match="append past its block table"):
        bm.allocate_slots(a, 2)  # 4 tokens > prompt 2 + max_tokens 1
    bm.allocate_slots(_req("b", 2), 2)
    with pytest.raises(ValueError, match="another request's block"):
        bm.free_blocks("a", bm.get_block_table("b"))
    bm.free(a)
    with pytest.raises(ValueError, match="double free"):
        bm.free(a)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 3)
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        BlockManager(0, 4)


# --- the paged engine ---------------------------------------------------------------------------


def _tokens(llm, prompts, params, arrivals=None):
    return [o.token_ids for o in llm.generate(prompts, params, arrivals)]


GREEDY = SamplingParams(max_tokens=9, ignore_eos=True)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("case", ["burst", "arrivals", "mixed-lengths"])
def test_paged_gives_the_naive_engines_greedy_tokens(tiny64, block_size, case, engine_on):
    prompts, params, arrivals = PROMPTS, GREEDY, None
    if case == "arrivals":
        arrivals = [0.0, 0.0, 0.01, 0.02, 0.02, 0.05]
    if case == "mixed-lengths":
        params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (3, 13, 1, 6, 9, 4)]
    want = _tokens(tiny64, prompts, params)
    llm = engine_on(tiny64, "paged", block_size=block_size, max_num_seqs=3)
    assert _tokens(llm, prompts, params, arrivals) == want
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and stats["kv_cache_usage"] == 0.0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize(
    "params",
    [GREEDY, SamplingParams(max_tokens=9, temperature=0.8, ignore_eos=True)],
    ids=["greedy", "seeded-temperature"],
)
def test_preemption_gives_exactly_the_tokens_of_a_run_without_it(tiny64, mode, params, engine_on):
    roomy = engine_on(tiny64, "paged", block_size=4, max_num_seqs=6)
    want = _tokens(roomy, PROMPTS, params)
    assert roomy.stats()["num_preemptions"] == 0
    tight = engine_on(tiny64, "paged", block_size=4, num_gpu_blocks=8, max_num_seqs=6, preemption_mode=mode)
    assert _tokens(tight, PROMPTS, params) == want
    stats = tight.stats()
    assert stats["num_preemptions"] > 0 and stats["num_free_blocks"] == 8
    assert stats["num_swapped_out"] == (stats["num_preemptions"] if mode == "swap" else 0)
    preempted = [rid for s in tight.trace for rid in s.preempted_ids]
    swapped = [rid for s in tight.trace for rid in s.swapped_out_ids]
    assert len(preempted) == stats["num_preemptions"] and swapped == (preempted if mode == "swap" else [])
    assert tight.trace[-1].kv_tokens == tight.trace[-1].kv_allocated_tokens == 0
    # a decode computes one token; a recompute of prompt + generated tokens is traced as a prefill
    assert all(s.num_scheduled_tokens[rid] == 1 for s in tight.trace for rid in s.decode_ids)
    if mode == "recompute":
        resumed = [
            s
            for s in tight.trace
            for rid in s.prefill_ids
            if rid in preempted
            and s.num_scheduled_tokens[rid] > 1
            and any(rid in t.preempted_ids for t in tight.trace[: s.step])
        ]
        assert resumed, "no recompute of a preempted request was traced as a prefill"


def test_trace_records_block_tables_when_they_change(tiny64, engine_on):
    llm = engine_on(tiny64, "paged", block_size=4, num_gpu_blocks=10)
    llm.generate([[1, 2, 3], [4, 5, 6, 7, 8]], SamplingParams(max_tokens=4, ignore_eos=True))
    trace = llm.trace
    assert trace.num_gpu_blocks == 10 and trace.block_size == 4
    assert trace[0].block_tables == {"0": [0], "1": [1, 2]}  # prompts of 3 and 5 tokens
    assert trace[1].block_tables is None  # token 4 of "0" and 6 of "1" fit the blocks they hold
    assert trace[2].block_tables == {"0": [0, 3], "1": [1, 2]}  # token 5 of "0" opens a block
    for s in trace:
        assert s.kv_allocated_tokens >= s.kv_tokens and s.kv_allocated_tokens % 4 == 0
    assert trace[-1].block_tables == {}


def test_backend_is_called_once_per_layer_per_step(tiny64, monkeypatch, engine_on):
    calls, plans = [], []
    plan_cls = kernels.TorchAttentionPlan

    class CountingPlan(plan_cls):
        def __init__(self, block_tables, *args):
            plans.append(block_tables.shape[0])
            super().__init__(block_tables, *args)

        def attend(self, q, *args):
            calls.append(q.shape[0])
            return super().attend(q, *args)

    monkeypatch.setattr(kernels, "TorchAttentionPlan", CountingPlan)
    llm = engine_on(tiny64, "paged", block_size=4, max_num_seqs=4)
    llm.generate(PROMPTS, SamplingParams(max_tokens=5, ignore_eos=True), [0.0, 0.0, 0.0, 0.01, 0.01, 0.02])
    assert len(plans) == len(llm.trace)  # the step's layout worked out once per step ...
    assert len(calls) == len(llm.trace) * tiny64.config.num_hidden_layers  # ... and one call per layer
    assert max(calls) > 1 and max(plans) > 1  # many requests per call


def test_bad_options_and_a_request_that_never_fits_raise(tiny64, engine_on):
    for options, name in [
        ({"block_size": 3}, "block_size"),
        ({"block_size": 0}, "block_size"),
        ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
        ({"preemption_mode": "drop"}, "preemption_mode"),
        ({"attention_backend": "cuda"}, "attention_backend"),
    ]:
        with pytest.raises(ValueError, match=name):
            build_engine("paged", tiny64.model, tiny64.device, None, **options)
    llm = engine_on(tiny64, "paged", block_size=4, num_gpu_blocks=3)
    with pytest.raises(ValueError, match=r"needs 13 KV cache tokens.*num_gpu_blocks=3 x block_size=4 = 12"):
        llm.generate([[1] * 5], SamplingParams(max_tokens=8))


def test_stats_of_other_engines_say_they_have_no_blocks(tiny64):
    tiny64.generate([[1, 2]], SamplingParams(max_tokens=2))
    assert "no KV blocks" in tiny64.stats()["note"]


def test_simulated_paged_run_makes_the_real_runs_decisions(tiny64):
    wl = workloads.fixed([5, 1, 9, 3, 7, 2, 12], [4, 7, 2, 5, 9, 3, 6])
    for mode in ("recompute", "swap"):
        options = {"max_num_seqs": 4, "block_size": 4, "num_gpu_blocks": 7, "preemption_mode": mode}
        real = build_engine("paged", tiny64.model, tiny64.device, None, attention_backend="torch", **options)
        for i, (p, sp, t) in enumerate(zip(wl.prompts, wl.sampling_params, wl.arrival_times)):
            real.add_request(Request(str(i), p, sp, arrival_time=t))
        real.run_to_completion()
        sim = simulate("paged", wl, "cpu-tiny", **options)

        def rows(trace):
            return [
                (
                    s.num_scheduled_tokens,
                    s.admitted_ids,
                    s.preempted_ids,
                    s.swapped_out_ids,
                    s.finished_ids,
                    s.block_tables,
                    s.kv_tokens,
                    s.kv_allocated_tokens,
                    s.num_running,
                    s.num_waiting,
                )
                for s in trace
            ]

        assert rows(sim.trace) == rows(real.trace)
        assert any(s.preempted_ids for s in sim.trace)
        assert (sim.trace.num_gpu_blocks, sim.trace.block_size) == (7, 4)


# --- property: random workloads on tiny pools -----------------------------------------------------


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_random_workloads_on_tiny_pools(tiny64, data):
    n = data.draw(st.integers(1, 5))
    block_size = data.draw(st.sampled_from([1, 2, 4]))
    prompt_lens = data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    max_tokens = data.draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))
    arrivals = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.003]), min_size=n, max_size=n))
    longest = max(p + m for p, m in zip(prompt_lens, max_tokens))
    num_blocks = data.draw(st.integers(-(-longest // block_size), -(-longest // block_size) + 4))
    mode = data.draw(st.sampled_from(["recompute", "swap"]))
    prompts = [[(7 * i + j) % 200 + 1 for j in range(p)] for i, p in enumerate(prompt_lens)]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in max_tokens]

    engine = build_engine(
        "paged",
        tiny64.model,
        tiny64.device,
        None,
        max_num_seqs=3,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        preemption_mode=mode,
        attention_backend="torch",
    )
    requests = [Request(str(i), p, sp, arrival_time=t) for i, (p, sp, t) in enumerate(zip(prompts, params, arrivals))]
    for r in requests:
        engine.add_request(r)
    bm = engine.scheduler.block_manager
    for _ in engine.run():
        held = [b for t in bm.block_tables.values() for b in t]
        assert len(held) == len(set(held))  # no block in two live tables
        assert len(held) + bm.num_free_blocks == num_blocks  # none leaked
        assert set(bm.block_tables) <= {r.request_id for r in engine.scheduler.running}
    assert [r.output_token_ids for r in requests] == _tokens(tiny64, prompts, params)
    assert all(r.finish_reason == "length" for r in requests)
    assert bm.num_free_blocks == num_blocks and not bm.block_tables


def test_block_map_draws_a_real_run_with_preemption(tiny64, engine_on):
    """The widget reads exactly what the engine records: every step's owners agree with the held
    tokens, and the step of a preemption marks the blocks it freed."""
    from minillm.widgets.block_map import block_map_state, draw_block_map

    llm = engine_on(tiny64, "paged", block_size=4, num_gpu_blocks=8, max_num_seqs=6)
    llm.generate(PROMPTS, GREEDY)
    trace = llm.trace
    for s in trace:
        state = block_map_state(trace, s.step)
        assert state.num_blocks == 8 and state.block_size == 4
        assert state.num_used_blocks * 4 == s.kv_allocated_tokens >= s.kv_tokens
    preempted = next(s.step for s in trace if s.preempted_ids)
    assert block_map_state(trace, preempted).freed_by_event, "a preemption frees the blocks it took back"
    ax = draw_block_map(trace, preempted, selected=trace[preempted].preempted_ids[0])
    assert "preempt" in " ".join(t.get_text() for t in ax.figure.findobj(lambda o: hasattr(o, "get_text"))).lower()
