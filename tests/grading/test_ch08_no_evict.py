"""Grading tests for chapter 8b (``MyNoEvictScheduler.schedule``, TensorRT-LLM's guaranteed-no-evict
admission).

The learner's scheduler drives minillm's paged engine (``scheduler_cls=``) in a child process
(``minillm.course.sandbox``); the ``run_*`` probe returns each step's plan, admissions and
preemptions and each request's tokens, as plain data. The rule decides exactly whom each step admits,
so every test compares the learner's admissions, step by step, with minillm's TensorRT-LLM engine
(``engine="trtllm"``, its default ``GUARANTEED_NO_EVICT``) on the same requests; each hand-made case
is built so that one mistake, and only it, admits someone the rule would not.
"""

from functools import cache

import pytest
import torch

from minillm import LLM, workloads
from minillm.course.sandbox import LearnerProcess
from minillm.engines import build_engine
from minillm.request import Request
from minillm.sim.clock import TickClock

IDEAS = {
    "*": (
        "The idea: a request may grow to its whole length (prompt + max_tokens), so admission counts it whole, "
        "beside everything the running requests may still take; then nobody can ever find the pool empty."
    ),
}
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def ch08():
    with LearnerProcess("ch08_no_evict") as learner:
        yield learner


@cache
def tiny_model():
    """The tiny model, once per process (the grader's and the learner's each load their own)."""
    return LLM("tiny", dtype="float32", device="cpu").model


def run_engine(name, workload, scheduler_cls=None, **options) -> dict:
    """``workload`` through engine ``name`` on a deterministic clock: each step's plan, admissions and
    preemptions, each request's tokens, and the error that stopped the run, if any."""
    if name in ("paged", "trtllm"):
        options = {"attention_backend": "torch", "block_size": BLOCK_SIZE, **options}
    engine = build_engine(name, tiny_model(), torch.device("cpu"), None, scheduler_cls=scheduler_cls, **options)
    engine.clock = TickClock()
    requests = [
        Request(str(i), p, sp, t, seed=i)
        for i, (p, sp, t) in enumerate(zip(workload.prompts, workload.sampling_params, workload.arrival_times))
    ]
    error = None
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
    bm = getattr(engine.scheduler, "block_manager", None)  # the naive engine has none
    return {
        "admitted": [s.admitted_ids for s in engine.trace],
        "preempted": [rid for s in engine.trace for rid in s.preempted_ids],
        "tokens": [r.output_token_ids for r in requests],
        "blocks_free": bm is None or bm.num_free_blocks == bm.num_blocks,
        "error": error,
    }


# --- probes: these run in the learner's process ------------------------------------------------
def run_with_your_scheduler(ch08, workload, **options):
    return run_engine("paged", workload, ch08.MyNoEvictScheduler, **options)


# --- checks: these run here --------------------------------------------------------------------
def run_yours(ch08, workload, **options) -> dict:
    return ch08.call(run_with_your_scheduler, workload, **options)


def reference(workload, num_gpu_blocks, max_num_seqs) -> dict:
    return run_engine("trtllm", workload, num_gpu_blocks=num_gpu_blocks, max_batch_size=max_num_seqs)


def assert_admits_as_the_rule(ch08, workload, num_gpu_blocks, max_num_seqs=8):
    options = dict(num_gpu_blocks=num_gpu_blocks, max_num_seqs=max_num_seqs)
    got, want = run_yours(ch08, workload, **options), reference(workload, num_gpu_blocks, max_num_seqs)
    assert want["error"] is None, want["error"]
    lengths = [f"{len(p)}+{sp.max_tokens}" for p, sp in zip(workload.prompts, workload.sampling_params)]
    where = f"requests (prompt+max_tokens) {lengths}, {num_gpu_blocks} blocks of {BLOCK_SIZE} tokens"
    for step, (mine, rule) in enumerate(zip(got["admitted"], want["admitted"])):
        assert mine == rule, (
            f"{where}: at step {step} your schedule admitted {mine or 'nobody'}, the rule admits {rule or 'nobody'}"
        )
    assert got["error"] is None, f"{where}: with your scheduler the run stopped: {got['error']}"
    assert got["admitted"] == want["admitted"], (
        f"{where}: your run admitted {got['admitted']}, the rule's {want['admitted']}"
    )
    return got


@pytest.mark.points(2)
@pytest.mark.hint(
    "Count a request by its whole length, request.max_num_tokens (prompt + max_tokens), in blocks "
    "(num_blocks_for): admitted on its prompt alone, it may later want blocks nobody can give it."
)
def test_counts_a_requests_whole_length(ch08):
    # A runs (8 blocks to its end, 1 held); B arrives later: its prompt needs 1 block, its whole length 9, and
    # only 12 - 8 = 4 are not promised to A, so B waits for A to finish.
    w = workloads.fixed([4, 4], [28, 32], arrival_times=[0.0, 0.05], seed=1)
    assert_admits_as_the_rule(ch08, w, num_gpu_blocks=12)


@pytest.mark.points(2)
@pytest.mark.hint(
    "Before admitting, take from the free blocks what every running request may still take: the blocks of "
    "its whole length it does not hold yet (num_blocks_for(max_num_tokens) - len(its block table))."
)
def test_counts_what_the_running_requests_may_still_take(ch08):
    # A runs (whole length 8 blocks, 2 held after its prompt): 10 free, but 6 still promised to A; B's whole
    # length is 5 blocks: 10 free would take it, 10 - 6 = 4 does not.
    w = workloads.fixed([8, 4], [24, 16], arrival_times=[0.0, 0.05], seed=2)
    assert_admits_as_the_rule(ch08, w, num_gpu_blocks=12)


@pytest.mark.hint(
    "Requests admitted earlier in the same step take their whole length from what is left too: subtract "
    "each admitted request's blocks before looking at the next."
)
def test_counts_the_requests_admitted_in_the_same_step(ch08):
    # Three requests at once, 5 blocks each to their end, 12 blocks: the first two fit, the third waits.
    w = workloads.fixed([4, 4, 4], [16, 16, 16], seed=3)
    assert_admits_as_the_rule(ch08, w, num_gpu_blocks=12)


@pytest.mark.hint(
    "A request whose whole length needs exactly the blocks left fits (<=, not <): refusing it leaves "
    "blocks unused that nobody else may take."
)
def test_a_request_that_exactly_fits_is_admitted(ch08):
    # Two requests at once, 6 blocks each to their end, on a pool of exactly 12.
    w = workloads.fixed([4, 4], [20, 20], seed=6)
    assert_admits_as_the_rule(ch08, w, num_gpu_blocks=12)


@pytest.mark.hint(
    "The first waiting request that does not fit stops admission for this step: a smaller one behind it "
    "waits its turn (TensorRT-LLM does not skip ahead)."
)
def test_nobody_jumps_the_queue(ch08):
    # A runs; B (7 blocks to its end) does not fit beside A; C (2 blocks) would, but it is behind B.
    w = workloads.fixed([4, 4, 4], [20, 24, 4], arrival_times=[0.0, 0.05, 0.06], seed=4)
    assert_admits_as_the_rule(ch08, w, num_gpu_blocks=12)


@pytest.mark.hint("At most max_num_seqs requests run at once, however many fit.")
def test_keeps_to_max_num_seqs(ch08):
    w = workloads.fixed([3, 2, 4, 1, 2], [3, 4, 2, 5, 3], seed=5)
    assert_admits_as_the_rule(ch08, w, num_gpu_blocks=64, max_num_seqs=2)


@pytest.mark.points(3)
@pytest.mark.hint(
    "Inside the engine, every running request runs every step (all its tokens not yet computed), nobody is "
    "preempted, each request gets the naive engine's tokens, and every block is free at the end."
)
def test_in_the_engine_nobody_is_ever_preempted(ch08):
    w = workloads.fixed(
        [7, 3, 11, 2, 9, 5, 4, 6],
        [9, 12, 5, 14, 6, 10, 8, 7],
        arrival_times=[0.0, 0.0, 0.02, 0.03, 0.05, 0.05, 0.1, 0.2],
    )
    for blocks, seqs in ((8, 8), (12, 3), (40, 8)):
        got = assert_admits_as_the_rule(ch08, w, num_gpu_blocks=blocks, max_num_seqs=seqs)
        assert not got["preempted"], f"{blocks} blocks: your run preempted {got['preempted']}"
        assert got["blocks_free"], f"{blocks} blocks: blocks still held after every request finished"
        naive = run_engine("naive", w)
        for i, (g, e) in enumerate(zip(got["tokens"], naive["tokens"])):
            assert g == e, f"{blocks} blocks: request {i} generated {g}, the naive engine {e}"
