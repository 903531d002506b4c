"""Grading tests for chapter 6 (``MyChunkedScheduler.schedule``, a token-budget policy of the
learner's design).

The learner's scheduler drives minillm's chunked engine (``scheduler_cls=``) in a child process
(``minillm.course.sandbox``); the ``run_*`` probe returns what every step planned, admitted and
preempted, which running requests were decoding when it was planned, and what every request got,
as plain data. How the budget is shared out is the learner's to design: the tests check the
contract the engine relies on, at every step, not minillm's plans -- the budget (and the
per-request threshold) is never exceeded, a decode is never starved while the budget could hold
it, every request finishes, and with the naive engine's tokens (chunking a prompt never changes
what a request generates). Each test first checks the one property its hint names.
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
    return LLM("tiny", dtype="float32", device="cpu").model


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
    decoding = []  # per schedule() call: the running requests with one token left to compute, before it
    schedule = engine.scheduler.schedule

    def schedule_and_record(now):
        before = [r.request_id for r in engine.scheduler.running if r.is_decode]
        plan = schedule(now)
        if plan is not None:
            decoding.append(before)
            planned.append(
                {
                    r.request_id: (plan.num_scheduled_tokens.get(r.request_id), r.num_tokens - r.num_computed_tokens)
                    for r in plan.scheduled
                }
            )
        return plan

    engine.scheduler.schedule = schedule_and_record
    error = None
    # A schedule that leaves a request out for good would loop forever: stop at ten times the tokens.
    max_steps = 10 * sum(len(p) + sp.max_tokens for p, sp in zip(workload.prompts, workload.sampling_params)) + 100
    try:
        for r in requests:
            engine.add_request(r)
        for _ in range(max_steps):
            if not engine.has_unfinished_requests():
                break
            engine.step(stream=False)
        else:
            stuck = [r.request_id for r in requests if r.finish_reason is None]
            raise RuntimeError(f"no progress: after {max_steps} engine steps, requests {stuck} had not finished")
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
        "decoding": decoding,
        "error": error,
    }


# --- probes: these run in the learner's process ------------------------------------------------
def run_with_your_scheduler(ch06, workload, **options):
    return run_engine("chunked", workload, ch06.MyChunkedScheduler, **options)


# --- checks: these run here --------------------------------------------------------------------
def run_yours(ch06, workload, **options) -> dict:
    return ch06.call(run_with_your_scheduler, workload, **options)


def budget_of(options) -> int:
    return options["max_num_batched_tokens"]


def assert_within_budget(got, options):
    """Every step within the budget, every planned request 1 token or more and no more than it has left."""
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
                "yet: plan num_tokens - num_computed_tokens at most"
            )


def assert_decodes_run(got, options):
    """A request decoding when the step was planned runs in it, unless it was preempted, or the
    step's whole budget went to decodes."""
    for step, (s, decoding) in enumerate(zip(got["steps"], got["decoding"])):
        left_out = [rid for rid in decoding if rid not in s["plan"] and rid not in s["preempted"]]
        if not left_out:
            continue
        all_decodes = set(s["plan"]) <= set(decoding) and sum(s["plan"].values()) == budget_of(options)
        assert all_decodes, (
            f"{options}, step {step}: planned {s['plan']} while request(s) {left_out} were decoding "
            f"(decoding: {decoding}): a decode waited while the budget went to a prompt"
        )


def assert_finishes(got, options):
    assert got["error"] is None, f"{options}: with your scheduler the run stopped: {got['error']}"


def assert_naive_tokens(got, workload, options):
    """Each request's tokens are the naive engine's: a prompt cut into chunks generates the same."""
    naive = run_engine("naive", workload)
    assert naive["error"] is None, naive["error"]
    for i, (g, e) in enumerate(zip(got["tokens"], naive["tokens"])):
        assert g == e, f"{options}: request {i} generated {g}, the naive engine {e}"


def assert_contract(got, workload, options):
    """Everything the engine relies on, at every step of the run."""
    assert_within_budget(got, options)
    threshold = options.get("long_prefill_token_threshold", 0)
    for step, s in enumerate(got["steps"]):
        over = {rid: n for rid, n in s["plan"].items() if threshold and n > threshold}
        assert not over, f"{options}, step {step}: {over} take more than long_prefill_token_threshold={threshold}"
    assert_decodes_run(got, options)
    assert_finishes(got, options)
    assert_naive_tokens(got, workload, options)


@pytest.mark.points(2)
@pytest.mark.hint(
    "Take every planned request's n from the budget, running and admitted alike: a step's tokens "
    "(decodes + chunks) never exceed max_num_batched_tokens."
)
def test_never_exceeds_the_budget(ch06):
    w = workloads.fixed(prompt_lens=[5, 5, 9, 3], output_lens=[4, 3, 5, 6], seed=1)
    for budget in (8, 6):
        options = dict(max_num_batched_tokens=budget, max_num_seqs=4, block_size=4)
        got = run_yours(ch06, w, **options)
        assert_within_budget(got, options)
        assert_contract(got, w, options)


@pytest.mark.hint(
    "A prompt of exactly the budget fits (<=, not <): a schedule that never admits it leaves it waiting forever."
)
def test_prompt_of_exactly_the_budget(ch06):
    w = workloads.fixed(prompt_lens=[8, 8], output_lens=[3, 2], seed=2)
    options = dict(max_num_batched_tokens=8, max_num_seqs=2, block_size=4)
    got = run_yours(ch06, w, **options)
    assert_finishes(got, options)
    assert_contract(got, w, options)


@pytest.mark.hint(
    "A prompt longer than the budget starts with a chunk (it need not fit whole), or it never runs: "
    "its chunks, one or more a step, add up to the prompt."
)
def test_prompt_one_token_longer_than_the_budget(ch06):
    w = workloads.fixed(prompt_lens=[9, 3], output_lens=[3, 4], seed=3)
    options = dict(max_num_batched_tokens=8, max_num_seqs=2, block_size=4)
    got = run_yours(ch06, w, **options)
    assert_finishes(got, options)
    assert_contract(got, w, options)


@pytest.mark.points(2)
@pytest.mark.hint(
    "Decodes never starve: a running request with one token left (is_decode) runs every step, unless it "
    "is preempted or the whole budget goes to such decodes; a long prompt's chunks take what is left."
)
def test_decodes_are_never_starved_by_a_long_prompt(ch06):
    # Two short prompts, then a long one: it is chunked over many steps while the short ones decode.
    w = workloads.fixed(prompt_lens=[3, 2, 40], output_lens=[12, 12, 2], seed=4)
    options = dict(max_num_batched_tokens=8, max_num_seqs=3, block_size=4)
    got = run_yours(ch06, w, **options)
    assert_decodes_run(got, options)
    assert_contract(got, w, options)


@pytest.mark.hint(
    "long_prefill_token_threshold (when > 0) caps what ONE request computes in a step, for running and "
    "newly admitted prompts alike; 0 means no cap."
)
def test_long_prefill_token_threshold_caps_a_chunk(ch06):
    w = workloads.fixed(prompt_lens=[17, 6, 11], output_lens=[3, 5, 4], seed=5)
    for threshold in (5, 0):
        options = dict(max_num_batched_tokens=16, long_prefill_token_threshold=threshold, max_num_seqs=3, block_size=4)
        got = run_yours(ch06, w, **options)
        for step, s in enumerate(got["steps"]):
            over = {rid: n for rid, n in s["plan"].items() if threshold and n > threshold}
            assert not over, (
                f"{options}, step {step}: planned {s['plan']}: {over} take more than "
                f"long_prefill_token_threshold={threshold}"
            )
        assert_contract(got, w, options)


@pytest.mark.points(2)
@pytest.mark.hint(
    "Plan at most the tokens a request has NOT computed yet (num_tokens - num_computed_tokens): a prompt's "
    "chunks add up to the prompt exactly, and it is sampled only after its last one (same tokens as the naive engine)."
)
def test_a_chunked_prompt_generates_the_naive_engines_tokens(ch06):
    w = workloads.fixed(prompt_lens=[13, 4, 21, 7], output_lens=[5, 6, 3, 4], seed=7)
    for budget in (5, 8):
        options = dict(max_num_batched_tokens=budget, max_num_seqs=4, block_size=4)
        got = run_yours(ch06, w, **options)
        assert_within_tokens_left(got, options)
        assert_finishes(got, options)
        assert_naive_tokens(got, w, options)
        assert_contract(got, w, options)


@pytest.mark.hint(
    "With max_num_batched_tokens=1 a step computes one token: plan while budget is left and stop at 0; "
    "never plan 0 tokens: who gets none waits for the next step."
)
def test_a_budget_of_one_token(ch06):
    w = workloads.fixed(prompt_lens=[3, 1, 2], output_lens=[3, 2, 2], seed=8)
    options = dict(max_num_batched_tokens=1, max_num_seqs=2, block_size=2)
    got = run_yours(ch06, w, **options)
    assert_within_budget(got, options)
    assert_contract(got, w, options)


# Eight requests on a pool too small for them all: blocks run out, requests are preempted and resumed.
PRESSURE = dict(prompt_lens=[7, 3, 11, 2, 9, 5, 4, 6], output_lens=[9, 12, 5, 14, 6, 10, 8, 7])


@pytest.mark.points(3)
@pytest.mark.hint(
    "Inside the engine, under pool pressure, every step must keep the contract: plan a running request only "
    "once allocate_or_preempt gave it blocks (it may preempt; give the tokens it returns back to the budget), "
    "bring swapped and waiting requests in with admit_first, and let every request finish."
)
def test_keeps_the_contract_under_pool_pressure_and_arrivals(ch06):
    w = workloads.fixed(**PRESSURE, seed=1)
    for options in (
        dict(max_num_batched_tokens=6, max_num_seqs=6, block_size=4, num_gpu_blocks=10),
        dict(max_num_batched_tokens=5, max_num_seqs=6, block_size=4, num_gpu_blocks=10, preemption_mode="swap"),
        dict(
            max_num_batched_tokens=16, long_prefill_token_threshold=4, max_num_seqs=4, block_size=2, num_gpu_blocks=24
        ),
    ):
        assert_contract(run_yours(ch06, w, **options), w, options)
    rng = np.random.default_rng(0)
    n = 10
    arrivals = workloads.fixed(
        rng.integers(1, 30, n).tolist(),
        rng.integers(1, 8, n).tolist(),
        arrival_times=np.cumsum(rng.exponential(0.04, n)).round(3).tolist(),
        seed=2,
    )
    options = dict(max_num_batched_tokens=12, max_num_seqs=4, block_size=4)
    assert_contract(run_yours(ch06, arrivals, **options), arrivals, options)
