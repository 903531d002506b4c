"""Chapter 6: chunked prefill -- the token budget, the long-prefill cap, preemption, the simulator twin."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm import LLM, SamplingParams, workloads
from minillm.engines import ENGINE_OPTIONS, build_engine
from minillm.engines.chunked import ChunkedPrefillScheduler
from minillm.engines.paged import PagedRunner
from minillm.request import Request
from minillm.sim import simulate

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7], [5] * 11, [3, 4], [7] * 17, [2]]
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def _tokens(llm, prompts, params, arrivals=None):
    return [o.token_ids for o in llm.generate(prompts, params, arrivals)]


def _prompt(i, n):
    return [(7 * i + j) % 200 + 1 for j in range(n)]


def _chunks(trace, rid):
    """The tokens ``rid`` computed at each step it ran."""
    return [s.num_scheduled_tokens[rid] for s in trace if rid in s.num_scheduled_tokens]


@pytest.mark.parametrize("budget", [1, 2, 3, 7, 16, 64])
def test_every_budget_gives_the_naive_engines_greedy_tokens(tiny64, budget, engine_on):
    # prompts shorter than, as long as, and one token longer than the budget, among others
    prompts = PROMPTS + [_prompt(1, max(1, budget - 1)), _prompt(2, budget), _prompt(3, budget + 1)]
    want = _tokens(tiny64, prompts, GREEDY)
    llm = engine_on(tiny64, "chunked", max_num_batched_tokens=budget, block_size=4, max_num_seqs=4)
    assert _tokens(llm, prompts, GREEDY) == want
    trace = llm.trace
    assert all(0 < s.num_batched_tokens <= budget for s in trace)
    longer = str(len(prompts) - 1)  # budget + 1 prompt tokens: two chunks at least
    assert len([s for s in trace if longer in s.prefill_ids]) >= 2
    assert sum(_chunks(trace, longer)) == budget + 1 + GREEDY.max_tokens - 1  # no token computed twice
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and stats["max_num_batched_tokens"] == budget


@pytest.mark.parametrize(("budget", "threshold"), [(4, 0), (6, 2), (3, 0)])
def test_a_budget_of_one_token_per_running_request_runs_every_decode_every_step(tiny64, budget, threshold, engine_on):
    prompts = [_prompt(i, n) for i, n in enumerate([23, 3, 30, 9, 17, 2, 26])]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (8, 12, 5, 10, 7, 9, 6)]
    llm = engine_on(
        tiny64,
        "chunked",
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=min(budget, 4),
        block_size=4,
    )
    outputs = llm.generate(prompts, params)
    trace = llm.trace
    assert llm.stats()["num_preemptions"] == 0
    for o in outputs:  # from its first token to its last, a request decodes at every step
        m = o.metrics
        assert [
            trace[i].num_scheduled_tokens.get(o.request_id) for i in range(m.first_token_step + 1, m.finished_step + 1)
        ] == [1] * (m.finished_step - m.first_token_step)
    assert any(s.decode_ids and s.prefill_ids for s in trace)  # prompt chunks ran beside decodes
    assert [o.token_ids for o in outputs] == _tokens(tiny64, prompts, params)


def test_long_prefill_token_threshold_caps_a_prompts_chunk(tiny64, engine_on):
    llm = engine_on(tiny64, "chunked", max_num_batched_tokens=64, long_prefill_token_threshold=5, block_size=4)
    assert _tokens(llm, PROMPTS, GREEDY) == _tokens(tiny64, PROMPTS, GREEDY)
    assert _chunks(llm.trace, "4")[:4] == [5, 5, 5, 2]  # 17 prompt tokens, then decodes
    assert all(n <= 5 for s in llm.trace for n in s.num_scheduled_tokens.values())
    assert max(s.num_batched_tokens for s in llm.trace) > 5  # the budget is shared by several requests


def test_no_request_is_sampled_before_its_whole_prompt_is_computed(tiny64, engine_on):
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    llm = engine_on(tiny64, "chunked", max_num_batched_tokens=4, block_size=2)
    outputs = llm.generate(PROMPTS, params)
    for o in outputs:
        chunks = [
            (s.step, s.num_scheduled_tokens[o.request_id]) for s in llm.trace if o.request_id in s.num_scheduled_tokens
        ]
        computed, prompt_done = 0, None
        for step, n in chunks:
            computed += n
            if prompt_done is None and computed >= len(o.prompt_token_ids):
                assert computed == len(o.prompt_token_ids)  # a chunk never runs past the prompt into nothing
                prompt_done = step
        assert o.metrics.first_token_step == prompt_done
        assert len(o.token_ids) == len(o.metrics.token_times) == 4
    assert [o.token_ids for o in outputs] == _tokens(tiny64, PROMPTS, params)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize(
    "params",
    [GREEDY, SamplingParams(max_tokens=6, temperature=0.8, ignore_eos=True)],
    ids=["greedy", "seeded-temperature"],
)
def test_preemption_on_a_tiny_pool_gives_the_naive_engines_tokens(tiny64, mode, params, engine_on):
    want = _tokens(tiny64, PROMPTS, params)  # seeded sampling: one generator per request, in every engine
    llm = engine_on(
        tiny64,
        "chunked",
        max_num_batched_tokens=5,
        block_size=4,
        num_gpu_blocks=7,
        max_num_seqs=6,
        preemption_mode=mode,
    )
    assert _tokens(llm, PROMPTS, params) == want
    stats = llm.stats()
    assert stats["num_preemptions"] > 0 and stats["num_free_blocks"] == 7
    assert stats["num_swapped_out"] == (stats["num_preemptions"] if mode == "swap" else 0)
    assert all(s.num_batched_tokens <= 5 for s in llm.trace)
    assert llm.trace[-1].kv_tokens == llm.trace[-1].kv_allocated_tokens == 0
    # a decode computes one token: a recomputed request's chunks, over its prompt and over the tokens
    # it had generated, are traced as prefills
    assert all(s.num_scheduled_tokens[rid] == 1 for s in llm.trace for rid in s.decode_ids)


def test_a_recompute_chunk_over_generated_tokens_is_traced_as_a_prefill(tiny64, engine_on):
    """After a preemption by recompute a request computes its prompt and the tokens it had generated
    again, in chunks; a chunk that starts past the prompt is still a prefill (``Request.is_decode``:
    a decode computes one token, its newest), not a decode of several tokens."""
    prompts = [[1] * 4, [2] * 6, [3] * 8, [4] * 4]
    llm = engine_on(
        tiny64,
        "chunked",
        max_num_batched_tokens=8,
        long_prefill_token_threshold=2,
        block_size=2,
        num_gpu_blocks=9,
        max_num_seqs=4,
        preemption_mode="recompute",
    )
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    assert _tokens(llm, prompts, params) == _tokens(tiny64, prompts, params)
    assert llm.stats()["num_preemptions"] > 0
    assert all(s.num_scheduled_tokens[rid] == 1 for s in llm.trace for rid in s.decode_ids)
    computed, past_prompt = {}, []  # tokens in the KV cache per request; chunks that start past the prompt
    for s in llm.trace:
        for rid in s.preempted_ids:
            computed[rid] = 0  # recompute: it starts over
        for rid, n in s.num_scheduled_tokens.items():
            if computed.get(rid, 0) >= len(prompts[int(rid)]) and n > 1:
                past_prompt.append(rid in s.prefill_ids)
            computed[rid] = computed.get(rid, 0) + n
    assert past_prompt and all(past_prompt), "no chunk past a prompt was recomputed: the workload no longer tests this"


def _ran(plan, requests):
    """What the engine's update does after a step: progress, and a token for each request done."""
    for r in requests:
        r.num_computed_tokens += plan.num_scheduled_tokens.get(r.request_id, 0)
        if r.num_computed_tokens == r.num_tokens:
            r.append_output_token_ids(5)


def test_decodes_take_the_budget_before_an_older_prompts_chunk():
    scheduler = ChunkedPrefillScheduler(
        max_num_seqs=2, max_num_batched_tokens=4, long_prefill_token_threshold=2, block_size=4, num_gpu_blocks=8
    )
    old = Request("old", [1] * 10, SamplingParams(max_tokens=2, ignore_eos=True), 0.0)
    new = Request("new", [2] * 2, SamplingParams(max_tokens=4, ignore_eos=True), 0.0)
    scheduler.add_request(old)
    scheduler.add_request(new)
    plan = scheduler.schedule(0.0)
    assert plan.num_scheduled_tokens == {"old": 2, "new": 2} and plan.admitted_ids == ["old", "new"]
    _ran(plan, [old, new])
    scheduler.long_prefill_token_threshold = 0  # no cap from now on: old could take the whole budget
    plan = scheduler.schedule(0.0)
    assert plan.num_scheduled_tokens == {"new": 1, "old": 3}  # new's decode first, old gets what is left


def test_a_victim_scheduled_earlier_in_the_step_gives_its_tokens_back():
    """Decodes go first, so the newest request may already hold this step's blocks when an older
    prompt's chunk needs them: it is preempted, unscheduled, and swapped out without its new blocks."""
    scheduler = ChunkedPrefillScheduler(
        max_num_seqs=2,
        max_num_batched_tokens=8,
        long_prefill_token_threshold=2,
        block_size=2,
        num_gpu_blocks=3,
        preemption_mode="swap",
    )
    old = Request("old", [1] * 5, SamplingParams(max_tokens=1, ignore_eos=True), 0.0)
    new = Request("new", [2] * 2, SamplingParams(max_tokens=3, ignore_eos=True), 0.0)
    scheduler.add_request(old)
    scheduler.add_request(new)
    plan = scheduler.schedule(0.0)  # old takes a 2-token chunk (the cap), new its whole 2-token prompt
    assert plan.num_scheduled_tokens == {"old": 2, "new": 2}
    _ran(plan, [old, new])
    plan = scheduler.schedule(0.0)  # new decodes (a 2nd block); old's next chunk needs a block: new goes
    assert plan.preempted_ids == plan.swapped_out_ids == ["new"]
    assert plan.num_scheduled_tokens == {"old": 2} and plan.blocks_to_swap_out == {"new": [1]}
    assert scheduler.block_manager.get_block_table("old") == [0, 2] and list(scheduler.swapped) == [new]


def test_bad_options_raise_naming_the_field_and_build_nothing(tiny64):
    built = []

    class Recorder(PagedRunner):
        def __init__(self, *args, **kwargs):
            built.append(self)
            super().__init__(*args, **kwargs)

    for options, words in [
        ({"max_num_batched_tokens": 0}, r"max_num_batched_tokens must be an integer >= 1"),
        ({"max_num_batched_tokens": 2.5}, r"max_num_batched_tokens must be an integer >= 1"),
        ({"max_num_batched_tokens": True}, r"max_num_batched_tokens"),
        ({"max_num_batched_tokens": "512"}, r"max_num_batched_tokens"),
        ({"long_prefill_token_threshold": -1}, r"long_prefill_token_threshold must be an integer >= 0"),
        ({"long_prefill_token_threshold": None}, r"long_prefill_token_threshold"),
        ({"block_size": 3}, "block_size"),
        ({"preemption_mode": "drop"}, "preemption_mode"),
    ]:
        with pytest.raises(ValueError, match=words):
            build_engine("chunked", tiny64.model, tiny64.device, None, runner_cls=Recorder, **options)
    assert built == []
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLM("tiny", engine="chunked", max_num_batched_tokens=0)
    assert ENGINE_OPTIONS["chunked"]["max_num_batched_tokens"] == 512
    assert ENGINE_OPTIONS["chunked"]["long_prefill_token_threshold"] == 0


def test_simulator_twin_respects_the_budget_at_h200_scale():
    wl = workloads.random_workload(
        40,
        prompt_lens=workloads.lognormal(median=1500, sigma=0.8, low=16, high=6000),
        output_lens=workloads.lognormal(median=40, sigma=0.5, low=1, high=200),
        rate=40.0,
        seed=1,
    )
    ttft, itl = {}, {}
    for budget in (512, 8192):
        result = simulate("chunked", wl, max_num_seqs=32, max_num_batched_tokens=budget, num_gpu_blocks=8192)
        trace = result.trace
        assert all(s.num_batched_tokens <= budget for s in trace)
        assert [len(o.token_ids) for o in result.outputs] == [p.max_tokens for p in wl.sampling_params]
        ttft[budget] = result.summary["time_to_first_token_seconds"]["p95"]
        itl[budget] = result.summary["inter_token_latency_seconds"]["p95"]
    assert max(s.num_batched_tokens for s in trace) > 512
    assert itl[512] < itl[8192] and ttft[512] > ttft[8192]  # the trade-off chapter 6 measures


# --- property: random workloads, budgets and tiny pools ---------------------------------------------


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_random_workloads_budgets_and_pools(tiny64, data):
    n = data.draw(st.integers(1, 5))
    block_size = data.draw(st.sampled_from([1, 2, 4]))
    prompt_lens = data.draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    max_tokens = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    arrivals = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.003]), min_size=n, max_size=n))
    longest = max(p + m for p, m in zip(prompt_lens, max_tokens))
    num_blocks = data.draw(st.integers(-(-longest // block_size), -(-longest // block_size) + 4))
    mode = data.draw(st.sampled_from(["recompute", "swap"]))
    budget = data.draw(st.integers(1, 12))
    threshold = data.draw(st.sampled_from([0, 0, 1, 3]))
    max_num_seqs = data.draw(st.integers(1, 3))
    prompts = [_prompt(i, p) for i, p in enumerate(prompt_lens)]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in max_tokens]

    engine = build_engine(
        "chunked",
        tiny64.model,
        tiny64.device,
        None,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
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
    assert all(0 < s.num_batched_tokens <= budget for s in engine.trace)
    assert all(n <= threshold for s in engine.trace for n in s.num_scheduled_tokens.values()) or threshold == 0
    assert [r.output_token_ids for r in requests] == _tokens(tiny64, prompts, params)
    assert all(r.finish_reason == "length" for r in requests)
    assert bm.num_free_blocks == num_blocks and not bm.block_tables
