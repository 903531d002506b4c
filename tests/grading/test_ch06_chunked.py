"""Grading tests for chapter 6 (``MyChunkedScheduler.schedule``, the token-budget policy).

The learner's scheduler drives minillm's chunked engine (``scheduler_cls=``) in a child process
(``minillm.course.sandbox``); the ``run_*`` probe returns what every step planned, admitted and
preempted and what every request got, as plain data. Here the same requests run through the
chunked engine with minillm's ``ChunkedPrefillScheduler`` (the plans must be the same, step by
step) and through the naive engine of chapter 1 (the tokens must be the same: chunking a prompt
never changes what a request generates). Each test first checks the one property its hint names,
so that a failure says what went wrong before it says where the plans part.
"""

from functools import cache

import numpy as np
import pytest
import torch

from minillm import LLM, workloads
from minillm.course.sandbox import LearnerProcess
from minillm.engines import build_engine
from minillm.request import Request
from minillm.sim.clock import TickClock

# The last rung of each test's hint ladder (check(..., hint=N)): the idea, never the code. A test
# gets the idea of the longest key in its name, else the "*" one.
IDEAS = {
    "*": (
        "The idea: the budget is spent in order, running decodes first (one token each), then prompts already "
        "running, then swapped and waiting requests, each getting what remains up to the threshold; a prompt "
        "that does not fit continues in later steps."
    ),
}


@pytest.fixture(scope="module")
def ch06():
    with LearnerProcess("ch06_chunked") as learner:
        yield learner


@cache
def tiny_model():
    """The tiny model, once per process (the grader's and the learner's each load their own)."""
    return LLM("tiny", dtype="float32").model


def run_engine(name, workload, scheduler_cls=None, **options) -> dict:
    """``workload`` through engine ``name``: each step's plan, admissions and preemptions, each
    request's tokens and (first token, finished) steps, and the error that stopped the run, if any."""
    if name == "chunked":
        options = {"attention_backend": "torch", **options}
    engine = build_engine(name, tiny_model(), torch.device("cpu"), None, scheduler_cls=scheduler_cls, **options)
    engine.clock = TickClock()
    requests = [
        Request(str(i), p, sp, t, seed=i)
        for i, (p, sp, t) in enumerate(zip(workload.prompts, workload.sampling_params, workload.arrival_times))
    ]
    planned = []  # per schedule() call: each planned request's (tokens planned, tokens not yet in the KV cache)
    schedule = engine.scheduler.schedule

    def schedule_and_record(now):
        plan = schedule(now)
        if plan is not None:
            planned.append(
                {
                    r.request_id: (plan.num_scheduled_tokens.get(r.request_id), r.num_tokens - r.num_computed_tokens)
                    for r in plan.scheduled
                }
            )
        return plan

    engine.scheduler.schedule = schedule_and_record
    error = None
    try:
        for r in requests:
            engine.add_request(r)
        engine.run_to_completion()
    except NotImplementedError:
        raise
    except Exception as err:  # the steps so far still show where the run went wrong
        error = f"{type(err).__name__}: {err}"
    return {
        "steps": [
            {"plan": s.num_scheduled_tokens, "admitted": s.admitted_ids, "preempted": s.preempted_ids}
            for s in engine.trace
        ],
        "tokens": [r.output_token_ids for r in requests],
        "steps_of": [(r.metrics.first_token_step, r.metrics.finished_step) for r in requests],
        "planned": planned,
        "error": error,
    }


# --- probes: these run in the learner's process ------------------------------------------------
def run_with_your_scheduler(ch06, workload, **options):
    return run_engine("chunked", workload, ch06.MyChunkedScheduler, **options)


# --- checks: these run here --------------------------------------------------------------------
def run_yours(ch06, workload, **options) -> tuple[dict, dict]:
    """Your run and the reference run of ``workload`` (the reference must run cleanly)."""
    got = ch06.call(run_with_your_scheduler, workload, **options)
    expected = run_engine("chunked", workload, **options)
    assert expected["error"] is None, expected["error"]
    return got, expected


def budget_of(options) -> int:
    return options["max_num_batched_tokens"]


def assert_within_budget(got, options):
    assert_within_tokens_left(got, options)
    for step, s in enumerate(got["steps"]):
        total = sum(s["plan"].values())
        assert total <= budget_of(options), (
            f"{options}, step {step}: planned {s['plan']} (request id: tokens), {total} tokens, more than "
            f"max_num_batched_tokens={budget_of(options)}"
        )
        assert all(n >= 1 for n in s["plan"].values()), (
            f"{options}, step {step}: planned {s['plan']}: a planned request computes >= 1 token"
        )


def assert_within_tokens_left(got, options):
    """No request is planned more tokens than it has not computed yet (the step that failed included)."""
    for step, planned in enumerate(got["planned"]):
        for rid, (n, left) in planned.items():
            assert n is None or n <= left, (
                f"{options}, step {step}: planned {n} tokens for request {rid}, which has only {left} not computed "
                "yet: "
                f"plan num_tokens - num_computed_tokens at most"
            )


def assert_same_plans(got, expected, options):
    """Same plans, admissions and preemptions at every step, same number of steps, no error."""
    for step, (g, e) in enumerate(zip(got["steps"], expected["steps"])):
        assert g["plan"] == e["plan"], (
            f"{options}, step {step}: planned {g['plan']} (request id: tokens), expected {e['plan']}"
        )
        assert g["admitted"] == e["admitted"], (
            f"{options}, step {step}: admitted {g['admitted']}, expected {e['admitted']}"
        )
        assert g["preempted"] == e["preempted"], (
            f"{options}, step {step}: preempted {g['preempted']}, expected {e['preempted']}"
        )
    if got["error"]:
        raise AssertionError(
            f"{options}: the engine stopped at step {len(got['steps'])} with your scheduler: {got['error']}"
        )
    assert len(got["steps"]) == len(expected["steps"]), (
        f"{options}: the run took {len(got['steps'])} steps, expected {len(expected['steps'])}"
    )


def assert_naive_tokens(got, workload, options):
    """Each request's tokens are the naive engine's: a prompt cut into chunks generates the same."""
    naive = run_engine("naive", workload)
    assert naive["error"] is None, naive["error"]
    for i, (g, e) in enumerate(zip(got["tokens"], naive["tokens"])):
        assert g == e, f"{options}: request {i} generated {g}, the naive engine {e}"


def assert_same_run(ch06, workload, **options) -> dict:
    """Within the budget, the reference's plans step by step, and the naive engine's tokens."""
    got, expected = run_yours(ch06, workload, **options)
    assert_within_budget(got, options)
    assert_same_plans(got, expected, options)
    assert_naive_tokens(got, workload, options)
    return expected


@pytest.mark.points(2)
@pytest.mark.hint(
    "Take every planned request's n from the budget, running and admitted alike: a step's tokens "
    "(decodes + chunks) never exceed max_num_batched_tokens."
)
def test_never_exceeds_the_budget(ch06):
    w = workloads.fixed(prompt_lens=[5, 5, 9, 3], output_lens=[4, 3, 5, 6], seed=1)
    for budget in (8, 6):
        assert_same_run(ch06, w, max_num_batched_tokens=budget, max_num_seqs=4, block_size=4)


@pytest.mark.hint(
    "A prompt of exactly the budget is admitted and runs whole in one step (it fits: <=, not <); "
    "then the next one is admitted the step after."
)
def test_prompt_of_exactly_the_budget(ch06):
    w = workloads.fixed(prompt_lens=[8, 8], output_lens=[3, 2], seed=2)
    expected = assert_same_run(ch06, w, max_num_batched_tokens=8, max_num_seqs=2, block_size=4)
    assert expected["steps"][0]["plan"] == {"0": 8}


@pytest.mark.hint(
    "A prompt longer than the budget starts with a chunk: admit it with n = min(tokens left, budget left) "
    "(it need not fit whole); one token more than the budget takes two steps, budget then 1."
)
def test_prompt_one_token_longer_than_the_budget(ch06):
    w = workloads.fixed(prompt_lens=[9, 3], output_lens=[3, 4], seed=3)
    expected = assert_same_run(ch06, w, max_num_batched_tokens=8, max_num_seqs=2, block_size=4)
    assert [s["plan"].get("0") for s in expected["steps"][:2]] == [8, 1]


@pytest.mark.points(2)
@pytest.mark.hint(
    "Decodes first: plan the running requests with one token left before the prompts part way through, "
    "so a long prompt's chunks never starve a decode (every decode runs every step)."
)
def test_decodes_are_never_starved_by_a_long_prompt(ch06):
    # Two short prompts, then a long one: it is chunked over many steps while the short ones decode.
    w = workloads.fixed(prompt_lens=[3, 2, 40], output_lens=[12, 12, 2], seed=4)
    options = dict(max_num_batched_tokens=8, max_num_seqs=3, block_size=4)
    got, expected = run_yours(ch06, w, **options)
    for step, s in enumerate(got["steps"][1:10], start=1):
        missing = [rid for rid in ("0", "1") if rid not in s["plan"]]
        assert not missing, f"{options}, step {step}: planned {s['plan']}: decoding request(s) {missing} did not run"
    assert_within_budget(got, options)
    assert_same_plans(got, expected, options)


@pytest.mark.hint(
    "long_prefill_token_threshold (when > 0) caps what ONE request computes in a step: "
    "n = min(tokens left, threshold, budget left), for running and newly admitted prompts alike."
)
def test_long_prefill_token_threshold_caps_a_chunk(ch06):
    w = workloads.fixed(prompt_lens=[17, 6, 11], output_lens=[3, 5, 4], seed=5)
    options = dict(max_num_batched_tokens=16, long_prefill_token_threshold=5, max_num_seqs=3, block_size=4)
    got, expected = run_yours(ch06, w, **options)
    for step, s in enumerate(got["steps"]):
        over = {rid: n for rid, n in s["plan"].items() if n > 5}
        assert not over, (
            f"{options}, step {step}: planned {s['plan']}: {over} take more than long_prefill_token_threshold=5"
        )
    assert_same_plans(got, expected, options)
    assert_naive_tokens(got, w, options)
    assert_same_run(ch06, w, max_num_batched_tokens=16, long_prefill_token_threshold=0, max_num_seqs=3, block_size=4)


@pytest.mark.points(2)
@pytest.mark.hint(
    "Running requests before waiting ones: a prompt part way through gets its next chunk before "
    "anyone new is admitted; admit from waiting only with the budget left after all running requests."
)
def test_running_prompts_go_before_waiting_ones(ch06):
    # Request 0's prompt takes three steps; request 1 arrives while it is part way through.
    w = workloads.fixed(prompt_lens=[20, 5, 3], output_lens=[3, 4, 2], arrival_times=[0.0, 0.015, 0.03], seed=6)
    options = dict(max_num_batched_tokens=8, max_num_seqs=3, block_size=4)
    got, expected = run_yours(ch06, w, **options)
    for step, (g, e) in enumerate(zip(got["steps"], expected["steps"])):
        if e["plan"].get("0", 0) > 1 and g["plan"].get("0") != e["plan"]["0"]:
            raise AssertionError(
                f"{options}, step {step}: planned {g['plan']}: request 0, part way through its prompt, "
                f"should get {e['plan']['0']} tokens (expected {e['plan']})"
            )
    assert_same_plans(got, expected, options)


@pytest.mark.points(2)
@pytest.mark.hint(
    "Plan at most the tokens a request has NOT computed yet (num_tokens - num_computed_tokens): a prompt's "
    "chunks add up to the prompt exactly, and it is sampled only after its last one (same tokens as the naive engine)."
)
def test_a_chunked_prompt_generates_the_naive_engines_tokens(ch06):
    w = workloads.fixed(prompt_lens=[13, 4, 21, 7], output_lens=[5, 6, 3, 4], seed=7)
    for budget in (5, 8):
        options = dict(max_num_batched_tokens=budget, max_num_seqs=4, block_size=4)
        got, expected = run_yours(ch06, w, **options)
        assert_within_tokens_left(got, options)
        if got["error"] is None:
            assert_naive_tokens(got, w, options)
            for i, (g, e) in enumerate(zip(got["steps_of"], expected["steps_of"])):
                assert tuple(g) == tuple(e), (
                    f"{options}: request {i}'s (first token, finished) steps are {tuple(g)}, "
                    f"expected {tuple(e)}: its first token comes with its prompt's last chunk"
                )
        assert_same_plans(got, expected, options)


@pytest.mark.hint(
    "With max_num_batched_tokens=1 a step computes exactly one token: plan a decode, a chunk or an admission "
    "only while budget is left (stop at 0); never plan 0 tokens: who gets none waits for the next step."
)
def test_a_budget_of_one_token(ch06):
    w = workloads.fixed(prompt_lens=[3, 1, 2], output_lens=[3, 2, 2], seed=8)
    expected = assert_same_run(ch06, w, max_num_batched_tokens=1, max_num_seqs=2, block_size=2)
    assert all(sum(s["plan"].values()) == 1 for s in expected["steps"])


# Eight requests on a pool too small for them all: blocks run out, requests are preempted and resumed.
PRESSURE = dict(prompt_lens=[7, 3, 11, 2, 9, 5, 4, 6], output_lens=[9, 12, 5, 14, 6, 10, 8, 7])


@pytest.mark.points(3)
@pytest.mark.hint(
    "Inside the engine your schedule() must plan as vLLM's policy does at every step: decodes, running "
    "prompts, then swapped, then waiting requests, within the budget, preempting (allocate_or_preempt) "
    "when blocks run short, and admitting nobody in a step that preempted someone while others still "
    "run. A decode is a request with exactly one token not yet in the KV cache: one recomputed after a "
    "preemption has output tokens, yet a whole prefill to redo."
)
def test_runs_the_chunked_engine_like_vllms_policy(ch06):
    w = workloads.fixed(**PRESSURE, seed=1)
    assert_same_run(ch06, w, max_num_batched_tokens=6, max_num_seqs=6, block_size=4, num_gpu_blocks=10)
    assert_same_run(
        ch06, w, max_num_batched_tokens=5, max_num_seqs=6, block_size=4, num_gpu_blocks=10, preemption_mode="swap"
    )
    assert_same_run(
        ch06,
        w,
        max_num_batched_tokens=16,
        long_prefill_token_threshold=4,
        max_num_seqs=4,
        block_size=2,
        num_gpu_blocks=24,
    )
    rng = np.random.default_rng(0)
    n = 10
    arrivals = workloads.fixed(
        rng.integers(1, 30, n).tolist(),
        rng.integers(1, 8, n).tolist(),
        arrival_times=np.cumsum(rng.exponential(0.04, n)).round(3).tolist(),
        seed=2,
    )
    assert_same_run(ch06, arrivals, max_num_batched_tokens=12, max_num_seqs=4, block_size=4)
