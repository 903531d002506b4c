"""Grading tests for chapter 3 (``IterationLevelScheduler.schedule``).

The learner's scheduler runs inside minillm's continuous engine (``scheduler_cls=``) next to the
engine's own ``ContinuousBatchScheduler``: every step must admit the same requests and plan the
same tokens, so every request gets the same tokens at the same steps.
"""

import numpy as np
import pytest
import torch

from minillm import LLM, workloads
from minillm.course import load_impl
from minillm.engines import build_engine
from minillm.request import Request


@pytest.fixture(scope="module")
def ch03():
    return load_impl("ch03_scheduling")


@pytest.fixture(scope="module")
def model():
    return LLM("tiny", dtype="float32", device="cpu").model


class TickClock:
    """A deterministic engine clock: each reading moves time on by ``tick`` seconds, and waiting
    jumps straight to the time waited for. The engine makes the same decisions every run."""

    def __init__(self, tick: float = 0.01):
        self.t, self.tick = 0.0, tick

    def now(self) -> float:
        self.t += self.tick
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)


def run(model, workload, scheduler_cls=None, **options):
    """``workload`` on the continuous engine; returns its requests (finished) and the trace."""
    engine = build_engine("continuous", model, torch.device("cpu"), None, scheduler_cls=scheduler_cls, **options)
    engine.clock = TickClock()
    requests = [Request(str(i), p, sp, t, seed=i)
                for i, (p, sp, t) in enumerate(zip(workload.prompts, workload.sampling_params, workload.arrival_times))]
    for r in requests:
        engine.add_request(r)
    for _ in engine.run():
        pass
    return requests, engine.trace


def admissions(trace) -> list[str]:
    return [rid for step in trace for rid in step.admitted_ids]


def assert_same_run(model, ch03, workload, **options):
    """The learner's scheduler and minillm's on ``workload``: same admissions, plans, tokens and steps."""
    got, trace = run(model, workload, ch03.IterationLevelScheduler, **options)
    expected, expected_trace = run(model, workload, **options)
    for step, (s, e) in enumerate(zip(trace, expected_trace)):
        assert s.admitted_ids == e.admitted_ids, f"step {step}: admitted {s.admitted_ids}, expected {e.admitted_ids}"
        assert s.num_scheduled_tokens == e.num_scheduled_tokens, (
            f"step {step}: planned {s.num_scheduled_tokens} (request id: tokens), expected {e.num_scheduled_tokens}")
        assert s.slots == e.slots, (
            f"step {step}: slots {s.slots}, expected {e.slots}: admit with self._admit(request), return slots=dict(self.slots)")
    assert len(trace) == len(expected_trace), f"the run took {len(trace)} steps, expected {len(expected_trace)}"
    for r, e in zip(got, expected):
        assert r.output_token_ids == e.output_token_ids, (
            f"request {r.request_id}: tokens {r.output_token_ids}, expected {e.output_token_ids}")
        steps, expected_steps = ((x.metrics.first_token_step, x.metrics.finished_step) for x in (r, e))
        assert steps == expected_steps, f"request {r.request_id}: (first token step, finished step) {steps}, expected {expected_steps}"
    return got, trace


@pytest.mark.hint("Admit waiting requests at every step, as soon as a slot is free: C must take A's slot the step after A finishes.")
def test_two_slot_example(ch03):
    w = workloads.two_slot_example()
    yours = LLM("tiny", engine="continuous", dtype="float32", max_num_seqs=2, scheduler_cls=ch03.IterationLevelScheduler)
    got = yours.generate(w.prompts, w.sampling_params)
    expected = LLM("tiny", engine="continuous", dtype="float32", max_num_seqs=2).generate(w.prompts, w.sampling_params)
    for r, e in zip(got, expected):
        assert r.token_ids == e.token_ids, f"request {r.request_id}: tokens {r.token_ids}, expected {e.token_ids}"
        steps, expected_steps = ((x.metrics.first_token_step, x.metrics.finished_step) for x in (r, e))
        assert steps == expected_steps, f"request {r.request_id}: (first token step, finished step) {steps}, expected {expected_steps}"


@pytest.mark.hint("Plan num_tokens - num_computed_tokens for every running request: the whole prompt when admitted, then 1.")
def test_plan_prefill_then_one_token_per_step(model, ch03):
    w = workloads.fixed(prompt_lens=[7, 3, 12], output_lens=[4, 6, 2])
    _, trace = assert_same_run(model, ch03, w, max_num_seqs=4)
    assert trace[0].num_scheduled_tokens == {"0": 7, "1": 3, "2": 12} and trace[1].num_scheduled_tokens == {"0": 1, "1": 1, "2": 1}


@pytest.mark.hint("Stop admitting when len(self.running) reaches max_num_seqs; fill every free slot otherwise.")
def test_respects_max_num_seqs(model, ch03):
    w = workloads.fixed(prompt_lens=[4, 2, 6, 3, 5, 2, 4], output_lens=[3, 1, 5, 2, 4, 6, 1])
    _, trace = assert_same_run(model, ch03, w, max_num_seqs=3)
    assert max(len(step.num_scheduled_tokens) for step in trace) == 3


@pytest.mark.hint("Admit only while num_reserved_kv_tokens + max_num_tokens <= num_kv_tokens; add each admitted one's max_num_tokens.")
def test_respects_kv_capacity(model, ch03):
    w = workloads.fixed(prompt_lens=[10, 8, 12, 4, 9, 6], output_lens=[6, 4, 3, 8, 2, 5])
    got, trace = assert_same_run(model, ch03, w, max_num_seqs=6, num_kv_tokens=32)
    need = {r.request_id: r.max_num_tokens for r in got}
    for step in trace:
        reserved = sum(need[rid] for rid in step.slots)
        assert reserved <= 32, f"step {step.step}: running {list(step.slots)} reserve {reserved} KV tokens, capacity 32"


@pytest.mark.hint("First come, first served: when the oldest waiting request does not fit, admit nobody, even a smaller one behind it.")
def test_first_come_first_served(model, ch03):
    # Request 1 does not fit beside request 0; request 2 would, but must not overtake it.
    w = workloads.fixed(prompt_lens=[10, 20, 2], output_lens=[6, 4, 2])
    _, trace = assert_same_run(model, ch03, w, max_num_seqs=3, num_kv_tokens=30)
    assert admissions(trace) == ["0", "1", "2"], f"admission order {admissions(trace)}, expected arrival order"


@pytest.mark.hint("Requests arrive over time: admit from waiting at every step, oldest first, within the slots and the KV capacity.")
def test_random_workload_with_arrivals(model, ch03):
    rng = np.random.default_rng(0)
    n = 12
    w = workloads.fixed(rng.integers(1, 16, n).tolist(), rng.integers(1, 8, n).tolist(),
                        arrival_times=np.cumsum(rng.exponential(0.05, n)).round(3).tolist(), seed=1)
    assert_same_run(model, ch03, w, max_num_seqs=3, num_kv_tokens=40)
