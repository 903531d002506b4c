"""The batching engines of chapters 2-4 (static / dynamic, continuous, selective) on the one engine loop.

Every engine must produce the naive loop's greedy tokens (float64, so batching cannot flip a
token), and schedule the way its chapter says: asserted on step numbers and the trace, not on
wall-clock durations.
"""

from collections import Counter

import numpy as np
import pytest

from minillm import SamplingParams
from minillm.engines import build_engine
from minillm.engines.continuous import ContinuousBatchScheduler
from minillm.engines.naive import ModelRunner

BATCHING_ENGINES = ["static", "continuous", "selective"]


@pytest.fixture(scope="module")
def naive(tiny64):
    return tiny64


@pytest.fixture(scope="module")
def three_slots(tiny64, engine_on):
    """Each batching engine with 3 slots: fewer than the prompts of most tests."""
    return {e: engine_on(tiny64, e, max_num_seqs=3) for e in BATCHING_ENGINES}


@pytest.fixture(scope="module")
def two_slots(tiny64, engine_on):
    return {e: engine_on(tiny64, e, max_num_seqs=2) for e in BATCHING_ENGINES}


def random_prompts(lens, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 256, size=n).tolist() for n in lens]


# --- 1. the same tokens as the naive loop ------------------------------------------------------


def test_every_engine_matches_the_naive_loop(naive, three_slots):
    prompts = random_prompts([5, 17, 2, 11, 8, 23, 3])
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in [6, 2, 9, 4, 1, 7, 5]]
    free = naive.generate(prompts, params)
    # One request stops early on a stop token; one samples (each request has its own seeded
    # generator, so batching must not change its draws either).
    params[3] = SamplingParams(max_tokens=4, ignore_eos=True, stop_token_ids=[free[3].token_ids[1]])
    params[5] = SamplingParams(max_tokens=7, ignore_eos=True, temperature=0.8, seed=3)
    expected = [o.token_ids for o in naive.generate(prompts, params)]
    assert len(expected[3]) <= 2
    for engine, llm in three_slots.items():
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == expected, engine
        assert [o.finish_reason for o in outs] == [o.finish_reason for o in naive.last_outputs], engine
        assert max(s.num_running for s in llm.trace) == 3, engine
    static = three_slots["static"].trace
    assert static[0].num_input_tokens == 3 * 17  # three prompts left-padded to the longest
    assert static[0].num_padding_tokens == 3 * 17 - (5 + 17 + 2)


# --- 2. the two-slot example -----------------------------------------------------------------

# Two slots; A and B start together, C waits. Prefill produces a request's first token and every
# decode step one more, so a request that needs d decode steps after its prefill has max_tokens=d+1:
# A needs 2 (max_tokens=3), B needs 4 (max_tokens=5), C needs 2 (max_tokens=3).
TWO_SLOT_PROMPTS = random_prompts([4, 4, 4], seed=1)
TWO_SLOT_PARAMS = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (3, 5, 3)]


def run_two_slot_example(llm):
    a, b, c = (o.metrics for o in llm.generate(TWO_SLOT_PROMPTS, TWO_SLOT_PARAMS))
    assert (a.first_token_step, a.finished_step) == (0, 2)
    assert (b.first_token_step, b.finished_step) == (0, 4)
    return a, b, c


def test_two_slots_static_batch_blocks_c_until_b_finishes(two_slots):
    llm = two_slots["static"]
    a, b, c = run_two_slot_example(llm)
    assert c.first_token_step == b.finished_step + 1 == 5  # the next batch
    assert c.finished_step == 7
    for step in (3, 4):  # A has finished but keeps its slot, computing padding
        record = llm.trace[step]
        assert record.slots == {"0": 0, "1": 1}
        assert list(record.num_scheduled_tokens) == ["1"]
        assert record.num_input_tokens == 2 and record.num_padding_tokens == 1
    assert llm.trace[5].slots == {"2": 0} and llm.trace[5].admitted_ids == ["2"]


@pytest.mark.parametrize("engine", ["continuous", "selective"])
def test_two_slots_iteration_level_c_takes_a_slot(two_slots, engine):
    llm = two_slots[engine]
    a, b, c = run_two_slot_example(llm)
    assert c.first_token_step == a.finished_step + 1 == 3  # admitted the step after A left
    assert c.first_token_step < b.finished_step  # running beside B
    assert c.finished_step == 5
    step = llm.trace[3]
    assert step.admitted_ids == ["2"] and step.prefill_ids == ["2"] and step.decode_ids == ["1"]
    assert step.slots == {"1": 1, "2": 0}  # C holds A's old slot
    assert len(llm.trace) == 6 and all(s.num_padding_tokens == 0 for s in llm.trace)


# --- 3. dynamic batching: full, or the oldest request has waited max_queue_delay -------------

# Only lower bounds on times are exact (the clock never wakes early); upper bounds are generous.
PARAMS_2 = SamplingParams(max_tokens=2, ignore_eos=True)


def test_dynamic_batch_starts_when_full(tiny64, engine_on):
    llm = engine_on(tiny64, "static", max_num_seqs=2, max_queue_delay=30.0)
    outs = llm.generate(random_prompts([3, 5]), PARAMS_2, arrival_times=[0.0, 0.2])
    first, second = (o.metrics for o in outs)
    assert first.first_token_step == second.first_token_step == 0  # one batch
    assert 0.2 <= first.first_scheduled_time < 10  # started by the second arrival, not the delay
    assert first.queue_time >= 0.2 and second.queue_time < 10


def test_dynamic_batch_starts_after_max_queue_delay(tiny64, engine_on):
    llm = engine_on(tiny64, "static", max_num_seqs=4, max_queue_delay=0.2)
    outs = llm.generate(random_prompts([3, 5, 4]), PARAMS_2, arrival_times=[0.0, 0.05, 1.0])
    m0, m1, m2 = (o.metrics for o in outs)
    assert m0.first_token_step == m1.first_token_step == 0  # the second joined the waiting first
    assert m0.first_scheduled_time >= 0.2 and m0.queue_time >= 0.2
    assert m2.first_token_step > m1.finished_step  # too late for that batch: a batch of its own
    assert m2.first_scheduled_time >= 1.0 + 0.2
    assert llm.trace[0].slots == {"0": 0, "1": 1}  # a batch of 2 in 4 slots: not full


def test_static_batch_without_delay_starts_at_once_and_blocks_arrivals(tiny64, engine_on):
    llm = engine_on(tiny64, "static", max_num_seqs=4)
    outs = llm.generate(
        random_prompts([3, 5]), [SamplingParams(max_tokens=6, ignore_eos=True), PARAMS_2], arrival_times=[0.0, 0.05]
    )
    m0, m1 = (o.metrics for o in outs)
    assert m0.first_token_step == 0 and llm.trace[0].slots == {"0": 0}
    assert m1.first_token_step > m0.finished_step  # waits for the whole running batch
    assert m1.first_scheduled_time >= 0.05


@pytest.mark.parametrize("engine", ["naive", *BATCHING_ENGINES])
def test_timed_arrivals_are_respected(engine, naive, three_slots):
    llm = naive if engine == "naive" else three_slots[engine]
    outs = llm.generate(random_prompts([4, 6]), PARAMS_2, arrival_times=[0.0, 0.3])
    late = outs[1].metrics
    assert late.arrival_time == 0.3
    assert late.first_scheduled_time >= 0.3 and late.first_token_time >= late.first_scheduled_time
    assert 0 <= late.queue_time <= late.ttft <= late.e2e


# --- 4. bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "engine, options, match",
    [
        ("static", {"max_num_seqs": 0}, r"max_num_seqs must be an integer >= 1, got 0"),
        ("continuous", {"max_num_seqs": 0}, r"max_num_seqs must be an integer >= 1"),
        ("selective", {"max_num_seqs": 2.5}, r"max_num_seqs must be an integer >= 1, got 2.5"),
        ("static", {"max_num_seqs": True}, r"max_num_seqs"),
        ("static", {"max_queue_delay": -0.1}, r"max_queue_delay must be None or a number of seconds >= 0, got -0.1"),
        ("static", {"max_queue_delay": float("nan")}, r"max_queue_delay"),
        ("continuous", {"num_kv_tokens": 0}, r"num_kv_tokens must be None \(no limit\) or an integer >= 1, got 0"),
        ("static", {"num_kv_tokens": 64}, r"engine 'static' does not take the option\(s\) \['num_kv_tokens'\]"),
        (
            "continuous",
            {"max_queue_delay": 0.1},
            r"\['max_queue_delay'\]; it takes \['max_num_seqs', 'num_kv_tokens'\]",
        ),
        ("selective", {"max_num_seq": 4}, r"\['max_num_seq'\]"),
        ("naive", {"max_num_seqs": 4}, r"takes no engine options"),
    ],
)
def test_bad_engine_options(naive, engine, options, match):
    with pytest.raises(ValueError, match=match):
        build_engine(engine, naive.model, naive.device, naive.eos_token_id, **options)


def test_bad_engine_options_fail_at_llm_construction(tiny64, engine_on):
    with pytest.raises(ValueError, match="max_num_seqs"):
        engine_on(tiny64, "continuous", max_num_seqs=0)
    with pytest.raises(ValueError, match="max_queue_delay"):
        engine_on(tiny64, "static", max_queue_delay=-1)


def test_plug_in_classes_are_checked_by_what_the_engine_needs(naive):
    class Mine(ContinuousBatchScheduler):
        pass

    engine = build_engine("continuous", naive.model, naive.device, None, scheduler_cls=Mine, max_num_seqs=2)
    assert type(engine.scheduler) is Mine and engine.scheduler.max_num_seqs == 2
    with pytest.raises(ValueError, match=r"scheduler_cls=Mine cannot be built with engine 'static''s options"):
        build_engine("static", naive.model, naive.device, None, scheduler_cls=Mine)
    engine = build_engine("selective", naive.model, naive.device, None, runner_cls=ModelRunner)  # has all the loop uses
    assert type(engine.runner) is ModelRunner


@pytest.mark.parametrize("engine", ["continuous", "selective"])
def test_request_larger_than_the_kv_cache_fails_at_submission(engine, tiny64, engine_on):
    llm = engine_on(tiny64, engine, num_kv_tokens=40)
    before = llm.trace
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    with pytest.raises(
        ValueError,
        match=r"request 1: 36 prompt tokens \+ max_tokens=5 needs 41 KV cache tokens, "
        r"more than num_kv_tokens=40",
    ):
        llm.generate(random_prompts([10, 36]), params)
    assert llm.trace is before  # nothing ran
    outs = llm.generate(random_prompts([10, 35]), params)  # 40 tokens fit exactly
    assert [len(o.token_ids) for o in outs] == [5, 5]
    assert outs[1].metrics.first_token_step > outs[0].metrics.finished_step  # not both at once: 15 + 40 > 40


# --- 5. progress on random workloads -------------------------------------------------------------


@pytest.fixture(scope="module")
def tight_kv(tiny64, engine_on):
    """Iteration-level engines whose KV capacity, not their slots, limits admission."""
    return {e: engine_on(tiny64, e, max_num_seqs=4, num_kv_tokens=48) for e in ("continuous", "selective")}


@pytest.mark.timeout(300)  # a stalled loop fails instead of hanging
@pytest.mark.parametrize("seed", [0, 1])
def test_random_workloads_finish_with_naive_tokens(naive, three_slots, tight_kv, seed):
    rng = np.random.default_rng(seed)
    n = 10
    prompts = random_prompts(rng.integers(1, 30, size=n).tolist(), seed=seed)
    params = [SamplingParams(max_tokens=int(m), ignore_eos=True) for m in rng.integers(1, 10, size=n)]
    expected = [o.token_ids for o in naive.generate(prompts, params)]
    engines = {**three_slots, **{f"{e} (tight KV)": llm for e, llm in tight_kv.items()}}
    for name, llm in engines.items():
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == expected, name
        assert [len(o.token_ids) for o in outs] == [p.max_tokens for p in params], name
        assert len(llm.trace) <= sum(1 + p.max_tokens for p in params), name  # never slower than one at a time
        slots_limit = 4 if "tight" in name else 3
        for record in llm.trace:
            assert len(record.slots) <= slots_limit and sorted(set(record.slots.values())) == sorted(
                record.slots.values()
            )
            assert all(0 <= s < slots_limit for s in record.slots.values())
            if record.kv_capacity_tokens:
                assert record.kv_tokens <= record.kv_allocated_tokens <= record.kv_capacity_tokens


# --- 6. selective batching: prefills and decodes in one forward pass ------------------------------


@pytest.mark.parametrize("engine, passes_in_mixed_step", [("selective", 1), ("continuous", 2)])
def test_forward_passes_per_step(two_slots, engine, passes_in_mixed_step):
    llm = two_slots[engine]
    calls = []
    hook = llm.model.register_forward_pre_hook(lambda module, args: calls.append(len(llm.trace)))  # the step running
    try:
        run_two_slot_example(llm)
    finally:
        hook.remove()
    per_step = Counter(calls)
    mixed = llm.trace[3]  # C's prefill beside B's decode
    assert mixed.prefill_ids == ["2"] and mixed.decode_ids == ["1"]
    assert per_step[3] == mixed.num_forward_passes == passes_in_mixed_step
    assert [per_step[i] for i in range(len(llm.trace))] == llm.trace.column("num_forward_passes")
    if engine == "selective":
        assert mixed.num_input_tokens == mixed.num_batched_tokens == 4 + 1  # one flat batch, no padding
