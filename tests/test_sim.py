"""The simulator: same scheduling decisions as the real engines, simulated time from the cost model."""

import pytest

from minillm import workloads
from minillm.engines import BUILDERS, ENGINE_OPTIONS, build_engine
from minillm.models.tiny import tiny_hf_config
from minillm.request import Request
from minillm.sampling_params import SamplingParams
from minillm.sim import Profile, simulate
from minillm.sim.calibrate import fit_profile
from minillm.sim.cost_model import attention_pairs
from minillm.sim.model_shape import model_numbers, model_shape, weightless_model

ENGINES = list(BUILDERS)


def _run_real(llm, engine, wl, **options):
    """The real engine on ``wl``: the outputs' requests and the trace."""
    real = build_engine(engine, llm.model, llm.device, None, **options)
    requests = [
        Request(str(i), p, sp, arrival_time=t)
        for i, (p, sp, t) in enumerate(zip(wl.prompts, wl.sampling_params, wl.arrival_times))
    ]
    for r in requests:
        real.add_request(r)
    for _ in real.run():
        pass
    return requests, real.trace


def _options(engine, **options):
    return {k: v for k, v in options.items() if k in ENGINE_OPTIONS[engine]}


def _steps(outputs):
    return [
        (
            o.metrics.first_token_step,
            o.metrics.finished_step,
            len(o.output_token_ids if isinstance(o, Request) else o.token_ids),
        )
        for o in outputs
    ]


def _step_rows(trace):
    return [
        (
            s.num_scheduled_tokens,
            s.prefill_ids,
            s.admitted_ids,
            s.finished_ids,
            s.slots,
            s.num_running,
            s.num_waiting,
            s.kv_tokens,
            s.kv_allocated_tokens,
            s.num_input_tokens,
            s.num_forward_passes,
        )
        for s in trace
    ]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "wl",
    [workloads.fixed([5, 1, 9, 3, 7, 2], [4, 7, 2, 5, 1, 3]), workloads.two_slot_example()],
    ids=["mixed", "two-slot"],
)
def test_simulated_run_makes_the_real_runs_decisions(tiny, engine, wl):
    options = _options(engine, max_num_seqs=2 if len(wl) == 3 else 3)
    real, real_trace = _run_real(tiny, engine, wl, **options)
    sim = simulate(engine, wl, "cpu-tiny", **options)
    assert _steps(sim.outputs) == _steps(real)
    assert _step_rows(sim.trace) == _step_rows(real_trace)
    assert [len(o.token_ids) for o in sim.outputs] == [p.max_tokens for p in wl.sampling_params]
    assert sim.summary["num_requests"] == len(wl)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_simulated_chunked_run_makes_the_real_runs_decisions(tiny, mode):
    """The chunked engine's twin is the paged runner's: the real scheduler cuts the same chunks,
    preempts the same requests and holds the same blocks, step by step."""
    wl = workloads.fixed([5, 1, 9, 3, 7, 2, 12], [4, 7, 2, 5, 9, 3, 6])
    options = {
        "max_num_seqs": 4,
        "max_num_batched_tokens": 5,
        "long_prefill_token_threshold": 4,
        "block_size": 4,
        "num_gpu_blocks": 7,
        "preemption_mode": mode,
    }
    real, real_trace = _run_real(tiny, "chunked", wl, **options)
    sim = simulate("chunked", wl, "cpu-tiny", **options)

    def rows(trace):
        return [
            (
                s.num_scheduled_tokens,
                s.prefill_ids,
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

    assert _steps(sim.outputs) == _steps(real)
    assert rows(sim.trace) == rows(real_trace)
    assert any(s.preempted_ids for s in sim.trace) and max(s.num_batched_tokens for s in sim.trace) == 5
    assert any(len([s for s in sim.trace if str(i) in s.prefill_ids]) > 1 for i in range(len(wl)))  # prompts in chunks


def test_two_slot_example_static_waits_for_the_whole_batch():
    result = simulate("static", workloads.two_slot_example(), max_num_seqs=2)
    trace, (_, b, c) = result.trace, result.outputs
    assert c.metrics.first_scheduled_time == b.metrics.finished_time  # C starts only after B finishes
    assert c.metrics.first_token_step == b.metrics.finished_step + 1
    assert trace[2].slots == {"0": 0, "1": 1} and trace[2].num_scheduled_tokens == {"1": 1}  # A's row idles


def test_two_slot_example_continuous_gives_a_slot_to_c_when_a_finishes():
    result = simulate("continuous", workloads.two_slot_example(), max_num_seqs=2)
    a, b, c = result.outputs
    assert c.metrics.first_token_step == a.metrics.finished_step + 1
    assert c.metrics.first_scheduled_time == a.metrics.finished_time
    step = result.trace[c.metrics.first_token_step]
    assert step.admitted_ids == ["2"] and step.slots["2"] == result.trace[0].slots["0"]  # A's slot
    assert c.metrics.finished_time <= b.metrics.finished_time


@pytest.mark.parametrize("name", ["h200-qwen3-0.6b", "cpu-tiny"])
def test_forward_time_is_the_time_of_forward_cost(name):
    profile = Profile.load(name)  # the twins use forward_time; calibration and tests use forward_cost
    for args in [
        (1, 1, 1, 1),
        (1, 512, 512, attention_pairs(0, 512)),
        (64, 64, 70_000, 70_000),
        (8, 300, 9_000, 123_456),
    ]:
        assert profile.forward_time(*args) == profile.forward_cost(*args).time


@pytest.mark.parametrize("name", ["h200-qwen3-0.6b", "cpu-tiny"])
def test_cost_never_falls_when_a_pass_computes_more(name):
    p = Profile.load(name)
    base = dict(num_seqs=4, num_tokens=4, context_tokens=400, attention_pairs=400)
    t0 = p.forward_cost(**base).time
    for key in base:
        for factor in (2, 10, 100):
            assert p.forward_cost(**{**base, key: base[key] * factor}).time >= t0


def test_batched_decodes_share_the_weight_reads_on_h200():
    p = Profile.load("h200-qwen3-0.6b")
    n, context = 32, 100
    batch = p.forward_cost(n, n, n * (context + 1), n * attention_pairs(context, 1))
    alone = p.forward_cost(1, 1, context + 1, attention_pairs(context, 1))
    assert p.weight_bytes > p.kv_bytes_per_token * n * (context + 1)  # weights dominate the bytes
    assert batch.time < 0.2 * n * alone.time


def test_h200_profile_matches_the_anchor_measurements():
    p = Profile.load("h200-qwen3-0.6b")
    assert p.memory_bandwidth == 4.25e12  # minillm/benchmarks/anchors/README.md: device-to-device copy
    assert p.peak_flops == 800e12  # bf16 8192^3 matmul
    assert p.kv_bytes_per_token == 112 * 1024
    assert round(p.weight_bytes / 1e9, 2) == 1.19
    assert p.weight_bytes / p.memory_bandwidth == pytest.approx(0.28e-3, rel=0.02)  # "about 0.28 ms"
    kv_floor = p.forward_cost(256, 256, 256 * 1024, 256 * 1024)  # batch 256 at 1k context: "near 7 ms"
    assert 6.5e-3 < (kv_floor.bytes - p.weight_bytes) / p.memory_bandwidth < 7.5e-3
    assert {k: getattr(p, k) for k in model_numbers(weightless_model(p.model), 2)} == model_numbers(
        weightless_model(p.model), 2
    )


def test_cpu_tiny_profile_loads_and_describes_the_tiny_model(tiny):
    p = Profile.load("cpu-tiny")
    assert p.model == model_shape(tiny_hf_config())
    assert {k: getattr(p, k) for k in model_numbers(tiny.model, 4)} == model_numbers(tiny.model, 4)
    assert p.memory_bandwidth > 0 and p.peak_flops > 0 and p.calibration_points
    assert "Measured" in p.notes


def test_fit_recovers_a_known_profile():
    truth = Profile.load("h200-qwen3-0.6b")
    measured = []
    for batch, new, context in [(1, 1, 100), (64, 1, 1000), (256, 1, 2000), (1, 4096, 0), (4, 2048, 0), (1, 16, 0)]:
        cost = truth.forward_cost(batch, batch * new, batch * (context + new), batch * attention_pairs(context, new))
        measured.append({"batch": batch, "new_tokens": new, "context": context, "seconds": cost.time})
    numbers = {
        k: getattr(truth, k) for k in ("num_params", "weight_bytes", "kv_bytes_per_token", "attention_flops_per_pair")
    }
    fitted = fit_profile("fit", truth.model, numbers, measured)
    for m in fitted.calibration_points:
        assert m["fitted_seconds"] == pytest.approx(m["seconds"], rel=0.05)
    assert fitted.forward_overhead == pytest.approx(truth.forward_overhead, rel=0.05)


def test_arrivals_and_queue_times_run_on_the_simulated_clock():
    later = workloads.fixed([8, 8], [3, 3], arrival_times=[0.0, 100.0])
    first, second = simulate("naive", later).outputs
    assert first.metrics.finished_time < 100.0
    assert second.metrics.first_scheduled_time == 100.0 and second.metrics.queue_time == 0.0  # the clock jumped

    together = workloads.fixed([8, 8], [3, 3], arrival_times=[0.0, 1e-6])
    first, second = simulate("naive", together).outputs
    assert second.metrics.queue_time == pytest.approx(first.metrics.finished_time - 1e-6)

    delayed = workloads.fixed([8, 8], [3, 3], arrival_times=[0.0, 0.1])
    a, b = simulate("static", delayed, max_num_seqs=4, max_queue_delay=0.5).outputs
    assert a.metrics.first_scheduled_time == pytest.approx(0.5)  # the batcher waited its queue delay
    assert a.metrics.queue_time == pytest.approx(0.5) and b.metrics.queue_time == pytest.approx(0.4)


def test_simulated_step_times_come_from_the_cost_model():
    p = Profile.load("h200-qwen3-0.6b")
    trace = simulate("naive", workloads.fixed([10], [2]), p).trace
    assert trace[0].duration == pytest.approx(p.forward_cost(1, 10, 10, attention_pairs(0, 10)).time)
    assert trace[1].duration == pytest.approx(p.forward_cost(1, 1, 11, attention_pairs(10, 1)).time)


def test_a_learners_scheduler_and_runner_subclasses_run_in_the_simulator():
    from minillm.engines.continuous import ContinuousBatchScheduler
    from minillm.engines.selective import SelectiveBatchRunner
    from minillm.sim.simulate import build_sim_engine
    from minillm.sim.twins import SimFlatBatchRunner

    class MyScheduler(ContinuousBatchScheduler):
        pass

    class MyRunner(SelectiveBatchRunner):
        pass

    engine = build_sim_engine(
        "selective", Profile.load("cpu-tiny"), scheduler_cls=MyScheduler, runner_cls=MyRunner, max_num_seqs=2
    )
    assert isinstance(engine.scheduler, MyScheduler) and isinstance(engine.runner, SimFlatBatchRunner)


def test_calibrate_times_the_model_and_fits_a_profile():
    from minillm.sim.calibrate import calibrate

    shape = Profile.load("cpu-tiny").model
    profile = calibrate(shape, "smoke", points=[(1, 1, 8), (4, 1, 8), (1, 16, 0)], repeats=1)
    assert [(p["batch"], p["new_tokens"], p["context"]) for p in profile.calibration_points] == [
        (1, 1, 8),
        (4, 1, 8),
        (1, 16, 0),
    ]
    assert all(p["seconds"] > 0 and p["fitted_seconds"] > 0 for p in profile.calibration_points)
    assert profile.model == shape and "Measured on" in profile.notes


def _everything(result):
    """All a simulation reports: every trace row's every field, every output with its metrics, the summary."""
    rows = [[getattr(s, f) for f in s.__slots__] for s in result.trace]
    outputs = [
        (o.request_id, o.prompt_token_ids, o.token_ids, o.finish_reason, vars(o.metrics)) for o in result.outputs
    ]
    return rows, outputs, result.summary


def _stop_at_sim_token():
    from minillm.sim.twins import SIM_TOKEN_ID

    wl = workloads.fixed([5, 3, 8], [9, 12, 6], arrival_times=[0.0, 0.0, 0.01])
    wl.sampling_params[1] = SamplingParams(max_tokens=12, stop_token_ids=[SIM_TOKEN_ID])  # stops at its first token
    return wl


_random = {
    "prompt_lens": workloads.lognormal(median=60, sigma=0.6, low=1, high=400),
    "output_lens": workloads.lognormal(median=20, sigma=0.9, low=1, high=300),
}
FAST_FORWARD_CASES = {  # name -> (workload, engine options; each engine takes those it has)
    "burst": (workloads.random_workload(60, **_random, seed=1), {"max_num_seqs": 8}),
    "timed-arrivals": (workloads.random_workload(120, **_random, rate=30.0, seed=2), {"max_num_seqs": 8}),
    "slow-arrivals": (workloads.random_workload(40, **_random, rate=2.0, seed=3), {"max_num_seqs": 4}),
    "kv-limit": (
        workloads.random_workload(80, **_random, rate=200.0, seed=4),
        {"max_num_seqs": 16, "num_kv_tokens": 800},
    ),
    "queue-delay": (
        workloads.random_workload(80, **_random, rate=40.0, seed=5),
        {"max_num_seqs": 6, "max_queue_delay": 0.05},
    ),
    "support-chat": (
        workloads.mix_workload("support chat: short answers + long summaries", 150, 300.0),
        {"max_num_seqs": 16},
    ),
    "two-slot": (workloads.two_slot_example(), {"max_num_seqs": 2}),
    "stop-token": (_stop_at_sim_token(), {"max_num_seqs": 2}),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("wl", "options"), list(FAST_FORWARD_CASES.values()), ids=list(FAST_FORWARD_CASES))
def test_fast_forward_gives_the_step_by_step_results_exactly(engine, wl, options):
    options = _options(engine, **options)
    step_by_step = simulate(engine, wl, fast_forward=False, **options)
    fast = simulate(engine, wl, **options)
    assert _everything(fast) == _everything(step_by_step)  # floats too: the same sums in the same order


@pytest.mark.parametrize("caching", [False, True], ids=["no cache", "prefix caching"])
def test_a_run_without_block_maps_differs_only_in_the_maps(caching):
    """What a capacity search runs: the same decisions, times and summary; the rows' block tables and
    cached free blocks (only the block-map widgets read them) left out."""
    wl = workloads.mix_workload("support chat: short answers + long summaries", 150, 300.0)
    options = dict(max_num_seqs=16, num_gpu_blocks=400, enable_prefix_caching=caching)
    with_maps, without = simulate("chunked", wl, **options), simulate("chunked", wl, block_maps=False, **options)
    maps = ("block_tables", "cached_free_blocks")
    assert any(s.block_tables for s in with_maps.trace)
    assert any(s.cached_free_blocks for s in with_maps.trace) == caching
    assert all(getattr(s, f) is None for s in without.trace for f in maps)
    for s in (*with_maps.trace, *without.trace):
        s.block_tables = s.cached_free_blocks = None
    assert _everything(without) == _everything(with_maps)


def test_fast_forward_skips_most_steps_of_long_answers(monkeypatch):
    from minillm.sim.fast_forward import SimEngine

    fast_forwarded = []
    original = SimEngine.fast_forward
    monkeypatch.setattr(
        SimEngine, "fast_forward", lambda self: fast_forwarded.append(original(self)) or fast_forwarded[-1]
    )
    result = simulate("naive", workloads.fixed([10, 20], [50, 30]))
    assert sum(fast_forwarded) == (50 - 2) + (30 - 2)  # all but each request's first and last token
    assert len(result.trace) == 80


def test_fast_forward_only_trusts_the_schedule_it_was_written_for():
    from minillm.engines.continuous import ContinuousBatchScheduler
    from minillm.sim.simulate import build_sim_engine

    IterationLevelScheduler = pytest.importorskip(
        "solutions.ch03_scheduling"
    ).IterationLevelScheduler  # none in a student copy

    class Renamed(ContinuousBatchScheduler):
        pass

    class OwnSchedule(ContinuousBatchScheduler):
        def schedule(self, now):
            return super().schedule(now)

    class OwnScheduleSteady(OwnSchedule):
        def is_steady(self):
            return super().is_steady()

    profile = Profile.load("cpu-tiny")
    uses = {
        cls: build_sim_engine("continuous", profile, scheduler_cls=cls).use_fast_forward
        for cls in (ContinuousBatchScheduler, Renamed, OwnSchedule, IterationLevelScheduler, OwnScheduleSteady)
    }
    assert uses == {
        ContinuousBatchScheduler: True,
        Renamed: True,
        OwnSchedule: False,
        IterationLevelScheduler: False,
        OwnScheduleSteady: True,
    }
    assert not build_sim_engine("continuous", profile, fast_forward=False).use_fast_forward
