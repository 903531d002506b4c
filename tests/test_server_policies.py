"""Chapter 8b: SGLang's, TensorRT-LLM's and TGI's scheduling policies on the paged engine -- the naive
engine's tokens, no block leaked or shared by two live tables, each policy's own rule, bad values refused."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm import LLM, SamplingParams
from minillm.capacity import at_rate, base_workload
from minillm.engines import build_engine
from minillm.request import Request
from minillm.sim import Profile, simulate
from minillm.workloads import Workload

PROMPTS = [[(7 * i + j) % 200 + 1 for j in range(n)] for i, n in enumerate([23, 3, 30, 9, 17, 2, 26, 33])]
PARAMS = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (8, 12, 5, 10, 7, 9, 6, 11)]
TIGHT = {"block_size": 4, "num_gpu_blocks": 12}  # 48 tokens: the longest request (44) fits alone

POLICIES = [
    ("sglang", {}),
    ("sglang", {"schedule_policy": "lpm", "chunked_prefill_size": 16}),
    ("sglang", {"schedule_policy": "lof", "chunked_prefill_size": -1}),
    ("sglang", {"enable_mixed_chunk": True, "chunked_prefill_size": 8, "disable_radix_cache": True}),
    ("trtllm", {}),
    ("trtllm", {"capacity_scheduler_policy": "MAX_UTILIZATION"}),
    ("trtllm", {"capacity_scheduler_policy": "STATIC_BATCH"}),
    ("trtllm", {"enable_chunked_prefill": True, "max_num_tokens": 40}),
    ("tgi", {}),
    ("tgi", {"prefill_chunking": False, "max_batch_prefill_tokens": 64}),
    ("tgi", {"max_batch_prefill_tokens": 16, "max_batch_size": 3}),
]


def _tokens(llm, prompts=PROMPTS, params=PARAMS):
    return [o.token_ids for o in llm.generate(prompts, params)]


def _llm(base, engine, **options):
    return LLM(base, engine=engine, attention_backend="torch", **options)


@pytest.fixture(scope="module")
def want(tiny64):
    return _tokens(tiny64)


@pytest.mark.parametrize(("engine", "options"), POLICIES, ids=lambda x: x if isinstance(x, str) else str(x))
@pytest.mark.parametrize("pool", ["roomy", "tight"])
def test_every_policy_gives_the_naive_engines_tokens_and_frees_every_block(tiny64, want, engine, options, pool):
    llm = _llm(tiny64, engine, **options, **(TIGHT if pool == "tight" else {}))
    assert _tokens(llm) == want
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert llm.trace[-1].kv_tokens == llm.trace[-1].kv_allocated_tokens == 0


def _engine(tiny64, name, **options):
    return build_engine(name, tiny64.model, tiny64.device, None, attention_backend="torch", **options)


def _run(engine, prompts, params, arrivals=None):
    requests = [
        Request(str(i), p, sp, arrival_time=(arrivals or [0.0] * len(prompts))[i])
        for i, (p, sp) in enumerate(zip(prompts, params))
    ]
    for r in requests:
        engine.add_request(r)
    bm = engine.scheduler.block_manager
    for _ in engine.run():
        held = [b for t in bm.block_tables.values() for b in t]
        assert len(held) == len(set(held)) or engine.scheduler.enable_prefix_caching  # shared only when cached
        assert len(set(held)) + bm.num_free_blocks == bm.num_blocks  # none leaked
    return requests


def _sim_trace(engine, prompts, params, arrivals, **options):
    """The trace of a simulated run (H200 cost model: a virtual clock, so arrivals land between exact steps)."""
    return simulate(engine, Workload(prompts, params, arrivals), Profile.load("h200-qwen3-0.6b"), **options).trace


# --- TGI ----------------------------------------------------------------------------------------


def test_tgi_reserves_each_requests_whole_length_at_admission_and_never_preempts(tiny64):
    engine = _engine(tiny64, "tgi", **TIGHT)
    requests = _run(engine, PROMPTS, PARAMS)
    trace = engine.trace
    first = trace[0]
    for rid in first.admitted_ids:  # prompt + max_tokens - 1 tokens' blocks, taken before the first token
        r = requests[int(rid)]
        assert len(first.block_tables[rid]) == -(-(r.max_num_tokens - 1) // 4)
    assert engine.scheduler.num_preemptions == 0 and not any(s.preempted_ids for s in trace)
    # the paged-vLLM-style chunked engine on the same pool preempts: reserving is what TGI buys with fewer running
    chunked = _engine(tiny64, "chunked", max_num_seqs=8, **TIGHT)
    _run(chunked, PROMPTS, PARAMS)
    assert chunked.scheduler.num_preemptions > 0
    assert max(s.num_running for s in trace) < max(s.num_running for s in chunked.trace)


def test_tgi_admits_in_strict_order_a_head_that_does_not_fit_blocks_the_rest(tiny64):
    # 12 blocks of 4: A holds 8 blocks to its end; B (7 blocks) does not fit beside it; C (1 block) would, but waits
    prompts, params = [[1] * 20, [2] * 20, [3] * 2], [SamplingParams(max_tokens=m, ignore_eos=True) for m in (12, 9, 2)]
    engine = _engine(tiny64, "tgi", **TIGHT)
    _run(engine, prompts, params)
    started = {rid: s.step for s in engine.trace for rid in s.admitted_ids}
    assert started["0"] == 0 and started["2"] >= started["1"] > 0


def test_tgi_without_chunking_pauses_the_batch_for_a_prefill_then_decodes():
    params = [SamplingParams(max_tokens=12, ignore_eos=True)] * 5
    trace = _sim_trace("tgi", PROMPTS[:5], params, [0, 0, 0, 1e-6, 1e-6], prefill_chunking=False)
    joins = [i for i, s in enumerate(trace) if s.admitted_ids and i > 0]
    assert joins
    for i in joins:
        assert not trace[i].decode_ids  # the running requests wait while the new prompts run alone
        assert trace[i + 1].decode_ids and not trace[i + 1].admitted_ids  # then everyone decodes


def test_tgi_waits_for_enough_requests_or_max_waiting_tokens_before_pausing_a_batch():
    """10 running and 1 waiting: below waiting_served_ratio=0.3 of the batch, so the lone request waits
    until the batch has decoded max_waiting_tokens steps since it last admitted; with chunking (TGI's
    default) both rules are off and it joins at once."""
    prompts, params = [[i + 1] * 3 for i in range(11)], [SamplingParams(max_tokens=30, ignore_eos=True)] * 11
    arrivals = [0.0] * 10 + [1e-6]
    trace = _sim_trace("tgi", prompts, params, arrivals, prefill_chunking=False, max_waiting_tokens=6)
    assert next(s.step for s in trace if "10" in s.admitted_ids) == 6  # the first prefill, then 5 decode steps
    trace = _sim_trace("tgi", prompts, params, arrivals)
    assert next(s.step for s in trace if "10" in s.admitted_ids) == 1


# --- TensorRT-LLM ----------------------------------------------------------------------------


def test_guaranteed_no_evict_admits_only_what_can_run_to_its_end_and_never_pauses(tiny64):
    engine = _engine(tiny64, "trtllm", **TIGHT)
    requests = _run(engine, PROMPTS, PARAMS)
    for s in engine.trace:  # the running requests' whole lengths always fit the pool
        running = [requests[int(rid)] for rid in s.slots]
        assert sum(-(-r.max_num_tokens // 4) for r in running) <= 12
    assert engine.scheduler.num_preemptions == 0
    util = _engine(tiny64, "trtllm", capacity_scheduler_policy="MAX_UTILIZATION", **TIGHT)
    _run(util, PROMPTS, PARAMS)
    assert util.scheduler.num_preemptions > 0  # next-step-only accounting admits more, then pauses


def test_static_batch_admits_only_when_nothing_runs():
    trace = _sim_trace(
        "trtllm", PROMPTS, PARAMS, [0, 0, 0, 1e-6, 1e-6, 1e-6, 1e-6, 1e-6], capacity_scheduler_policy="STATIC_BATCH"
    )
    joins = [i for i, s in enumerate(trace) if s.admitted_ids]
    assert len(joins) >= 2 and all(trace[i - 1].num_running == 0 for i in joins[1:])
    assert any(s.num_waiting for s in trace[: joins[1]])  # the late arrivals waited for the batch to drain


def test_trtllm_micro_batch_stops_at_max_num_tokens_and_chunks_in_whole_blocks(tiny64):
    engine = _engine(tiny64, "trtllm", max_num_tokens=40)  # no chunking: 23 + 3, then 30 waits for the next step
    _run(engine, PROMPTS, PARAMS)
    assert engine.trace[0].num_scheduled_tokens == {"0": 23, "1": 3}
    chunked = _engine(tiny64, "trtllm", max_num_tokens=40, enable_chunked_prefill=True, block_size=4)
    _run(chunked, PROMPTS, PARAMS)
    first = chunked.trace[0].num_scheduled_tokens
    assert first == {"0": 23, "1": 3, "2": 12}  # 14 tokens left: a chunk of 3 whole blocks
    assert all(s.num_batched_tokens <= 40 for s in chunked.trace)


# --- SGLang ----------------------------------------------------------------------------------


def test_sglang_runs_a_prefill_batch_or_a_decode_step_never_both_unless_mixed():
    arrivals = [0.0, 0.0, 1e-3, 1e-3, 2e-3, 2e-3, 3e-3, 3e-3]
    trace = _sim_trace("sglang", PROMPTS, PARAMS, arrivals, chunked_prefill_size=8)
    assert any(s.decode_ids for s in trace) and all(not (s.prefill_ids and s.decode_ids) for s in trace)
    mixed = _sim_trace("sglang", PROMPTS, PARAMS, arrivals, chunked_prefill_size=8, enable_mixed_chunk=True)
    assert any(s.prefill_ids and s.decode_ids for s in mixed)
    assert all(s.num_batched_tokens <= 8 for s in mixed)


def test_lpm_runs_the_requests_whose_prefix_is_cached_first(tiny64):
    system = list(range(1, 33))  # two 16-token blocks, cached by the first request
    prompts = [system + [99], [7] * 20, system + [50, 51], [8] * 20, system + [60]]
    params = [SamplingParams(max_tokens=4, ignore_eos=True)] * 5
    arrivals = [0.0, 1.0, 1.0, 1.0, 1.0]  # the first finishes before the others arrive
    order = {}
    for policy in ("fcfs", "lpm"):
        engine = _engine(tiny64, "sglang", schedule_policy=policy, max_running_requests=1)
        _run(engine, prompts, params, arrivals)
        order[policy] = [rid for s in engine.trace for rid in s.admitted_ids]
    assert order["fcfs"] == ["0", "1", "2", "3", "4"]
    assert order["lpm"] == ["0", "2", "4", "1", "3"]


def test_lof_runs_the_longest_outputs_first(tiny64):
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (2, 9, 4, 7)]
    engine = _engine(tiny64, "sglang", schedule_policy="lof", max_running_requests=1)
    _run(engine, [[5] * 4] * 4, params, [0.0, 1.0, 1.0, 1.0])
    assert [rid for s in engine.trace for rid in s.admitted_ids] == ["0", "1", "3", "2"]


def test_sglang_retracts_the_requests_with_the_fewest_tokens_and_raises_its_estimate(tiny64, want):
    # a low conservativeness admits on the hope that requests stop early; with ignore_eos they do not
    engine = _engine(tiny64, "sglang", schedule_conservativeness=0.1, disable_radix_cache=True, **TIGHT)
    scheduler = engine.scheduler
    requests = [Request(str(i), p, sp, arrival_time=0.0) for i, (p, sp) in enumerate(zip(PROMPTS, PARAMS))]
    for r in requests:
        engine.add_request(r)
    retractions = 0
    while engine.has_unfinished_requests():
        generated = {r.request_id: len(r.output_token_ids) for r in scheduler.running if r.is_decode}
        ratio = scheduler.new_token_ratio
        engine.step()
        row = engine.trace[-1]
        if row.preempted_ids:
            retractions += 1
            assert max(generated[v] for v in row.preempted_ids) <= min(generated[d] for d in row.decode_ids)
            assert scheduler.new_token_ratio > ratio  # it trusted its estimate too much
        elif row.decode_ids:
            assert scheduler.new_token_ratio <= ratio  # a decode step without retraction: it decays
    assert retractions > 0 and scheduler.num_preemptions >= retractions
    assert [r.output_token_ids for r in requests] == want


def test_the_new_token_ratio_decays_by_decode_step_to_its_floor():
    from minillm.engines.sglang import SGLangScheduler

    s = SGLangScheduler(schedule_conservativeness=1.0)
    assert s.init_new_token_ratio == pytest.approx(0.7) and s.min_new_token_ratio == pytest.approx(0.098)
    assert s.new_token_ratio_decay == pytest.approx((0.7 - 0.098) / 600)
    assert SGLangScheduler(schedule_conservativeness=2.0).init_new_token_ratio == 1.0


# --- every policy --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "option", "value", "message"),
    [
        ("sglang", "schedule_policy", "sjf", "schedule_policy must be one of"),
        ("sglang", "schedule_conservativeness", 0, "schedule_conservativeness must be a number > 0"),
        ("sglang", "chunked_prefill_size", 0, "chunked_prefill_size"),
        ("sglang", "max_running_requests", 0, "max_running_requests must be an integer >= 1"),
        ("sglang", "enable_mixed_chunk", "yes", "enable_mixed_chunk must be True or False"),
        ("trtllm", "capacity_scheduler_policy", "guaranteed_no_evict", "capacity_scheduler_policy must be one of"),
        ("trtllm", "max_batch_size", None, "max_batch_size must be an integer >= 1"),
        ("trtllm", "max_num_tokens", 0, "max_num_tokens must be an integer >= 1"),
        ("tgi", "waiting_served_ratio", -0.5, "waiting_served_ratio must be a number >= 0"),
        ("tgi", "max_waiting_tokens", -1, "max_waiting_tokens must be an integer >= 0"),
        ("tgi", "max_batch_prefill_tokens", 0, "max_batch_prefill_tokens must be an integer >= 1"),
        ("tgi", "prefill_chunking", 1, "prefill_chunking must be True or False"),
        ("tgi", "max_num_seqs", 8, "does not take the option"),
    ],
)
def test_bad_values_are_refused_by_name_before_anything_loads(engine, option, value, message):
    with pytest.raises(ValueError, match=message):
        LLM("no-such-model", engine=engine, **{option: value})  # refused before the model name is looked up


def test_requests_a_policy_could_never_run_are_refused_by_name(tiny64):
    big = [SamplingParams(max_tokens=30, ignore_eos=True)]
    with pytest.raises(ValueError, match="reserves 52 KV cache tokens up front"):
        _llm(tiny64, "tgi", **TIGHT).generate([[1] * 23], big)
    with pytest.raises(ValueError, match="exceed max_batch_prefill_tokens=16, and prefill_chunking is off"):
        _llm(tiny64, "tgi", prefill_chunking=False, max_batch_prefill_tokens=16).generate([[1] * 23], PARAMS[:1])
    with pytest.raises(ValueError, match="exceed max_num_tokens=16, and enable_chunked_prefill is off"):
        _llm(tiny64, "trtllm", max_num_tokens=16).generate([[1] * 23], PARAMS[:1])
    with pytest.raises(
        ValueError, match="needs 48 KV cache tokens; SGLang's admission needs fewer than the whole pool"
    ):
        _llm(tiny64, "sglang", **TIGHT).generate([[1] * 40], [SamplingParams(max_tokens=8)])
    with pytest.raises(ValueError, match="less than one block"):
        _llm(tiny64, "trtllm", max_num_tokens=16, enable_chunked_prefill=True)


@pytest.mark.parametrize("engine", ["sglang", "trtllm", "tgi"])
def test_each_policy_runs_in_the_simulator_at_h200_scale(engine):
    workload = at_rate(base_workload("mixed", 200, seed=0), 20.0)
    result = simulate(engine, workload, Profile.load("h200-qwen3-0.6b"), num_gpu_blocks=4096)
    assert [len(o.token_ids) for o in result.outputs] == [sp.max_tokens for sp in workload.sampling_params]


# --- property: random workloads, pools and options ------------------------------------------------


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
def test_random_workloads_pools_and_options(tiny64, data):
    n = data.draw(st.integers(1, 5))
    block_size = data.draw(st.sampled_from([1, 2, 4]))
    prompt_lens = data.draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    max_tokens = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    arrivals = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.003]), min_size=n, max_size=n))
    longest = max(p + m for p, m in zip(prompt_lens, max_tokens))
    num_blocks = data.draw(st.integers(-(-(longest + 1) // block_size), -(-(longest + 1) // block_size) + 4))
    engine, options = data.draw(
        st.sampled_from(
            [
                ("sglang", {"schedule_policy": data.draw(st.sampled_from(["fcfs", "lpm", "lof"]))}),
                ("sglang", {"chunked_prefill_size": data.draw(st.integers(1, 12)), "enable_mixed_chunk": True}),
                ("sglang", {"schedule_conservativeness": 0.05, "max_running_requests": data.draw(st.integers(1, 3))}),
                (
                    "trtllm",
                    {
                        "capacity_scheduler_policy": data.draw(
                            st.sampled_from(["GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH"])
                        )
                    },
                ),
                ("trtllm", {"enable_chunked_prefill": True, "max_num_tokens": data.draw(st.integers(block_size, 12))}),
                ("tgi", {"max_batch_prefill_tokens": data.draw(st.integers(1, 12))}),
                ("tgi", {"prefill_chunking": False, "max_batch_prefill_tokens": 12, "waiting_served_ratio": 1.0}),
            ]
        )
    )
    prompts = [[(7 * i + j) % 200 + 1 for j in range(p)] for i, p in enumerate(prompt_lens)]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in max_tokens]
    if engine == "trtllm" and not options.get("enable_chunked_prefill"):
        options["max_num_tokens"] = 12
    built = _engine(tiny64, engine, block_size=block_size, num_gpu_blocks=num_blocks, **options)
    requests = _run(built, prompts, params, arrivals)
    assert [r.output_token_ids for r in requests] == _tokens(tiny64, prompts, params)
    bm = built.scheduler.block_manager
    assert bm.num_free_blocks == num_blocks and not bm.block_tables


# --- the limits in each server's flags ------------------------------------------------------------


def test_server_flags_write_the_limits_of_a_run_in_each_servers_words():
    from minillm.capacity.server_flags import server_flags

    options = {"max_num_seqs": 16, "max_num_batched_tokens": 2048, "num_gpu_blocks": 4096}
    assert server_flags("vllm", "chunked", options)[:2] == ["--max-num-seqs 16", "--num-gpu-blocks-override 4096"]
    sglang = server_flags("sglang", "chunked", options)
    assert "--max-total-tokens 65536" in sglang and "--chunked-prefill-size 2048" in sglang
    assert "--disable-radix-cache" in sglang  # minillm's cache is off unless asked; SGLang's is on
    assert "--chunked-prefill-size -1" in server_flags("sglang", "paged", {"max_num_seqs": 4})
    trt = server_flags("trtllm", "chunked", {**options, "enable_prefix_caching": True})
    assert "--max_num_tokens 2048" in trt and "  max_tokens: 65536" in trt and "  enable_block_reuse: true" in trt
    tgi = server_flags("tgi", "chunked", {})  # the chunked engine's defaults: 8 requests, 512 tokens a step
    assert tgi[:2] == ["--max-batch-size 8", "--max-batch-prefill-tokens 512"]
    with pytest.raises(ValueError, match="format must be one of vllm, sglang, trtllm, tgi, got 'lmdeploy'"):
        server_flags("lmdeploy", "chunked", {})
    with pytest.raises(ValueError, match="not engine 'static'"):
        server_flags("vllm", "static", {})


def test_capacity_prints_the_limits_as_a_servers_flags_and_refuses_what_it_cannot_translate(capsys):
    from minillm.cli import main

    args = ["capacity", "--slo", "ttft_p95=0.5", "--num-requests", "20", "--rel-tol", "0.5", "--max-num-seqs", "4"]
    assert main([*args, "--format", "sglang"]) == 0
    out = capsys.readouterr().out
    assert "as sglang's flags" in out and "  --max-running-requests 4" in out
    assert main([*args, "--engine", "continuous", "--format", "tgi"]) == 2
    err = capsys.readouterr().err
    assert "not engine 'continuous'" in err and "rate" not in err  # refused before any search


def test_the_step_mix_shows_what_each_step_carried():
    from minillm.widgets import draw_step_mix
    from minillm.widgets.step_mix import step_mix

    params = [SamplingParams(max_tokens=8, ignore_eos=True)] * 3
    work = Workload([[1] * 20, [2] * 20, [3] * 600], params, [0.0, 0.0, 0.005])
    traces = {
        e: simulate(e, work, Profile.load("h200-qwen3-0.6b"), **o).trace
        for e, o in (("chunked", {"max_num_batched_tokens": 256}), ("sglang", {"chunked_prefill_size": 256}))
    }
    starts, durations, prefill, decode = step_mix(traces["chunked"])
    assert (prefill + decode == [s.num_batched_tokens for s in traces["chunked"]]).all()
    assert ((prefill > 0) & (decode > 0)).any()  # vLLM's rules: chunks beside decodes
    _, _, prefill, decode = step_mix(traces["sglang"])
    assert not ((prefill > 0) & (decode > 0)).any()  # SGLang's: one or the other
    fig = draw_step_mix(traces, window=(0.0, 0.05))
    bars = {a.get_gid() for ax in fig.axes for a in ax.patches}
    assert bars == {"prefill-chunked", "decode-chunked", "prefill-sglang", "decode-sglang"}
    assert "0% carried" in fig.axes[1].get_title() and "0% carried" not in fig.axes[0].get_title()


def test_every_engine_names_its_bound_on_requests_at_once():
    from minillm.engines import BUILDERS, ENGINE_OPTIONS, REQUESTS_AT_ONCE

    assert set(REQUESTS_AT_ONCE) == set(BUILDERS) - {"naive"}
    assert all(option in ENGINE_OPTIONS[engine] for engine, option in REQUESTS_AT_ONCE.items())
