"""Grading tests for chapter 3 (``IterationLevelScheduler.schedule``).

The learner's scheduler drives minillm's continuous engine (``scheduler_cls=``) in a child process
(``minillm.course.sandbox``); the ``run_*`` probe returns what every step admitted and planned and
what every request got, as plain data. Here the same requests run through the engine with its own
``ContinuousBatchScheduler``, and every step must admit the same requests and plan the same tokens,
so every request gets the same tokens at the same steps.
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
        "The idea: every step, each running request runs what it has not computed yet (its prompt once, then "
        "one token), and free slots are filled from the front of the queue while each newcomer's whole "
        "reservation fits the cache."
    ),
}


@pytest.fixture(scope="module")
def ch03():
    with LearnerProcess("ch03_scheduling") as learner:
        yield learner


@cache
def tiny_model():
    """The tiny model, once per process (the grader's and the learner's each load their own)."""
    return LLM("tiny", dtype="float32", device="cpu").model


def run_continuous_engine(workload, scheduler_cls=None, **options) -> dict:
    """``workload`` through the continuous engine: each step's admissions, plan and slots, each
    request's tokens and (first token, finished) steps, and the error that stopped the run, if any."""
    engine = build_engine("continuous", tiny_model(), torch.device("cpu"), None, scheduler_cls=scheduler_cls, **options)
    engine.clock = TickClock()
    requests = [
        Request(str(i), p, sp, t, seed=i)
        for i, (p, sp, t) in enumerate(zip(workload.prompts, workload.sampling_params, workload.arrival_times))
    ]
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
        "steps": [{"admitted": s.admitted_ids, "plan": s.num_scheduled_tokens, "slots": s.slots} for s in engine.trace],
        "tokens": [r.output_token_ids for r in requests],
        "steps_of": [(r.metrics.first_token_step, r.metrics.finished_step) for r in requests],
        "error": error,
    }


# --- probes: these run in the learner's process ------------------------------------------------
def run_with_your_scheduler(ch03, workload, **options):
    return run_continuous_engine(workload, ch03.IterationLevelScheduler, **options)


# --- checks: these run here --------------------------------------------------------------------
def assert_same_run(ch03, workload, **options) -> dict:
    """The learner's scheduler and minillm's on ``workload``: same admissions, plans, slots, tokens and steps."""
    got = ch03.call(run_with_your_scheduler, workload, **options)
    expected = run_continuous_engine(workload, **options)
    assert expected["error"] is None, expected["error"]
    for step, (s, e) in enumerate(zip(got["steps"], expected["steps"])):
        assert s["admitted"] == e["admitted"], f"step {step}: admitted {s['admitted']}, expected {e['admitted']}"
        assert s["plan"] == e["plan"], f"step {step}: planned {s['plan']} (request id: tokens), expected {e['plan']}"
        assert s["slots"] == e["slots"], (
            f"step {step}: slots {s['slots']}, expected {e['slots']}: admit with self._admit(request), return "
            "slots=dict(self.slots)"
        )
    if got["error"]:
        raise AssertionError(f"the engine stopped at step {len(got['steps'])} with your scheduler: {got['error']}")
    assert len(got["steps"]) == len(expected["steps"]), (
        f"the run took {len(got['steps'])} steps, expected {len(expected['steps'])}"
    )
    for i, (tokens, expected_tokens) in enumerate(zip(got["tokens"], expected["tokens"])):
        assert tokens == expected_tokens, f"request {i}: tokens {tokens}, expected {expected_tokens}"
    for i, (steps, expected_steps) in enumerate(zip(got["steps_of"], expected["steps_of"])):
        assert tuple(steps) == tuple(expected_steps), (
            f"request {i}: (first token step, finished step) {tuple(steps)}, expected {tuple(expected_steps)}"
        )
    return expected


def admissions(run: dict) -> list[str]:
    return [rid for step in run["steps"] for rid in step["admitted"]]


@pytest.mark.points(2)
@pytest.mark.hint(
    "Admit waiting requests at every step, as soon as a slot is free (num_kv_tokens=None: no KV limit): "
    "C must take A's slot the step after A finishes."
)
def test_two_slot_example(ch03):
    assert_same_run(ch03, workloads.two_slot_example(), max_num_seqs=2)


@pytest.mark.hint(
    "Plan num_tokens - num_computed_tokens for EVERY running request: the whole prompt in the step it is "
    "admitted, then 1 a step."
)
def test_plan_prefill_then_one_token_per_step(ch03):
    # One arrival at a time, so a new prompt's prefill shares its step with the others' decodes.
    w = workloads.fixed(prompt_lens=[7, 3, 12], output_lens=[8, 6, 3], arrival_times=[0.0, 0.1, 0.2])
    expected = assert_same_run(ch03, w, max_num_seqs=4)
    assert expected["steps"][0]["plan"] == {"0": 7}


@pytest.mark.hint(
    "Admit in a loop: in one step, fill every free slot (while fewer than max_num_seqs run), not one request a step."
)
def test_fills_every_free_slot_at_once(ch03):
    w = workloads.fixed(prompt_lens=[4, 2, 6, 3, 5], output_lens=[3, 3, 5, 2, 4])
    expected = assert_same_run(ch03, w, max_num_seqs=3)
    assert expected["steps"][0]["admitted"] == ["0", "1", "2"]


@pytest.mark.hint("Stop admitting when len(self.running) reaches max_num_seqs (not one more).")
def test_respects_max_num_seqs(ch03):
    w = workloads.fixed(prompt_lens=[4, 2, 6, 3, 5, 2, 4], output_lens=[3, 1, 5, 2, 4, 6, 1])
    for max_num_seqs in (1, 3):
        expected = assert_same_run(ch03, w, max_num_seqs=max_num_seqs)
        assert max(len(step["plan"]) for step in expected["steps"]) == max_num_seqs


@pytest.mark.hint(
    "Admit only while num_reserved_kv_tokens + max_num_tokens <= num_kv_tokens, and add each admitted "
    "request's max_num_tokens to num_reserved_kv_tokens."
)
def test_respects_kv_capacity(ch03):
    w = workloads.fixed(prompt_lens=[10, 8, 12, 4, 9, 6], output_lens=[6, 4, 3, 8, 2, 5])
    assert_same_run(ch03, w, max_num_seqs=6, num_kv_tokens=32)


@pytest.mark.hint(
    "An exact fit is admitted: a request fits when num_reserved_kv_tokens + max_num_tokens <= num_kv_tokens "
    "(<=, not <); one token more does not fit."
)
def test_kv_capacity_exact_fit(ch03):
    w = workloads.fixed(prompt_lens=[6, 4], output_lens=[4, 6])  # 10 KV tokens each
    assert admissions(assert_same_run(ch03, w, max_num_seqs=2, num_kv_tokens=20))[:2] == ["0", "1"]  # both at once
    expected = assert_same_run(ch03, w, max_num_seqs=2, num_kv_tokens=19)  # one token short: "1" waits
    assert expected["steps"][0]["admitted"] == ["0"]
    assert_same_run(
        ch03, workloads.fixed(prompt_lens=[12], output_lens=[4]), max_num_seqs=2, num_kv_tokens=16
    )  # fills it alone


@pytest.mark.hint(
    "First come, first served: when the oldest waiting request does not fit, admit nobody, even a smaller one behind "
    "it."
)
def test_first_come_first_served(ch03):
    # Request 1 does not fit beside request 0; request 2 would, but must not overtake it.
    w = workloads.fixed(prompt_lens=[10, 20, 2], output_lens=[6, 4, 2])
    expected = assert_same_run(ch03, w, max_num_seqs=3, num_kv_tokens=30)
    assert admissions(expected) == ["0", "1", "2"]


@pytest.mark.points(2)
@pytest.mark.hint(
    "Requests arrive over time: admit from waiting at every step, oldest first, within the slots and the KV capacity."
)
def test_random_workload_with_arrivals(ch03):
    rng = np.random.default_rng(0)
    n = 12
    w = workloads.fixed(
        rng.integers(1, 16, n).tolist(),
        rng.integers(1, 8, n).tolist(),
        arrival_times=np.cumsum(rng.exponential(0.05, n)).round(3).tolist(),
        seed=1,
    )
    assert_same_run(ch03, w, max_num_seqs=3, num_kv_tokens=40)
