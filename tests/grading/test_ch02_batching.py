"""Grading tests for chapter 2 (``left_pad`` and ``form_batch``).

minillm's static engine is the oracle: ``minillm.padded_batch.left_pad`` and
``minillm.static_batching.form_batch`` are the functions it calls, and the learner's functions,
plugged into the same engine, must make it run exactly as it runs with its own.
"""

import math
import random

import pytest
import torch

from minillm import LLM
from minillm.course import load_impl
from minillm.engines import build_engine
from minillm.padded_batch import left_pad as engine_left_pad
from minillm.request import Request
from minillm.sampling_params import SamplingParams
from minillm.static_batching import form_batch as engine_form_batch

EXAMPLE = [[5, 6, 7], [8], [9, 10]]


@pytest.fixture(scope="module")
def ch02():
    return load_impl("ch02_batching")


def random_batches():
    """The docstring's example, then batches with every row the same length, one row, and long ones."""
    rng = random.Random(0)
    batches = [EXAMPLE, [[1, 2], [3, 4]], [[7]], [[9] * 5]]
    batches += [[[rng.randrange(1, 259) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 6))]
                for _ in range(20)]
    return batches


def padded(ch02, batch, pad_id=0):
    """The learner's three tensors for ``batch``, checked for shape, and the engine's."""
    got = ch02.left_pad(batch, pad_id)
    assert isinstance(got, tuple) and len(got) == 3, f"return a tuple (input_ids, positions, mask), got {type(got).__name__}"
    expected = engine_left_pad(batch, pad_id)
    shape = tuple(expected[0].shape)
    for name, tensor in zip(("input_ids", "positions", "mask"), got):
        assert isinstance(tensor, torch.Tensor), f"{name} must be a torch.Tensor, got {type(tensor).__name__}"
        assert tuple(tensor.shape) == shape, (
            f"batch {batch}: {name} should have shape {shape} (B, longest prompt), got {tuple(tensor.shape)}")
    return got, expected


@pytest.mark.hint("Every row is as wide as the longest prompt; put pad_id in front of the shorter prompts (left padding).")
def test_left_pad_input_ids(ch02):
    for pad_id in (0, 258):
        for batch in random_batches():
            (ids, _, _), (expected, _, _) = padded(ch02, batch, pad_id)
            assert not ids.is_floating_point(), f"input_ids must be integers, got {ids.dtype}"
            assert torch.equal(ids.long(), expected), (
                f"left_pad({batch}, pad_id={pad_id}): input_ids should be {expected.tolist()}, got {ids.tolist()}")


@pytest.mark.hint("positions count 0, 1, 2, ... from each row's first real token (its column minus its number of pads); pads get 0.")
def test_left_pad_positions(ch02):
    for batch in random_batches():
        (_, positions, _), (_, expected, _) = padded(ch02, batch)
        assert not positions.is_floating_point(), f"positions must be integers, got {positions.dtype}"
        assert torch.equal(positions.long(), expected), (
            f"left_pad({batch}): positions should be {expected.tolist()}, got {positions.tolist()}")


@pytest.mark.hint("mask is a torch.bool tensor: True on each prompt's real tokens, False on the pads in front of them.")
def test_left_pad_mask(ch02):
    for batch in random_batches():
        (_, _, mask), (_, _, expected) = padded(ch02, batch)
        assert mask.dtype == torch.bool, f"mask must be a torch.bool tensor, got {mask.dtype}"
        assert torch.equal(mask, expected), f"left_pad({batch}): mask should be {expected.tolist()}, got {mask.tolist()}"


@pytest.mark.hint("Inside the engine, a wrong layout changes the tokens: check left_pad's three tensors against its docstring.")
def test_left_pad_runs_the_static_engine(ch02):
    prompts = [list(range(3 + i, 3 + i + n)) for i, n in enumerate([5, 17, 2, 11, 8])]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in [6, 2, 9, 4, 3]]
    yours = LLM("tiny", engine="static", dtype="float32", max_num_seqs=3, runner_cls=ch02.LeftPadRunner)
    got = yours.generate(prompts, params)
    engine = LLM("tiny", engine="static", dtype="float32", max_num_seqs=3)
    expected = engine.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected], "the static engine generated other tokens with your left_pad"
    assert yours.trace.column("num_input_tokens") == engine.trace.column("num_input_tokens")


# --- form_batch ---------------------------------------------------------------------------------

def check_form_batch(ch02, arrivals, now, max_num_seqs, max_queue_delay):
    got = ch02.form_batch(list(arrivals), now, max_num_seqs, max_queue_delay)
    expected = engine_form_batch(list(arrivals), now, max_num_seqs, max_queue_delay)
    call = f"form_batch({list(arrivals)}, now={now}, max_num_seqs={max_num_seqs}, max_queue_delay={max_queue_delay})"
    assert isinstance(got, tuple) and len(got) == 2, f"{call}: return a pair (n, wait_until), got {got!r}"
    n, wait_until = got
    assert n == expected[0] and (wait_until is None) == (expected[1] is None), f"{call} should be {expected}, got {got}"
    if wait_until is not None:
        assert math.isclose(wait_until, expected[1]), f"{call} should be {expected}, got {got}"


@pytest.mark.hint("A full batch (max_num_seqs or more waiting) starts at once, with max_num_seqs requests, whatever the delay.")
def test_form_batch_full_batch_starts_at_once(ch02):
    check_form_batch(ch02, [0.0, 0.1], 0.1, 2, 10.0)
    check_form_batch(ch02, [0.0, 0.1, 0.2, 0.3, 0.4], 0.4, 2, 10.0)
    check_form_batch(ch02, [1.0, 1.5, 2.0], 2.0, 3, 0.0)


@pytest.mark.hint("With max_queue_delay=None, start whatever is waiting right away: min(number waiting, max_num_seqs).")
def test_form_batch_without_delay_starts_what_is_waiting(ch02):
    check_form_batch(ch02, [0.0], 0.0, 4, None)
    check_form_batch(ch02, [0.0, 0.5], 3.0, 4, None)
    check_form_batch(ch02, [0.0] * 6, 0.0, 4, None)


@pytest.mark.hint("A partial batch waits for the oldest arrival + max_queue_delay: (0, that time) before it, start at or after it.")
def test_form_batch_waits_for_the_oldest_requests_deadline(ch02):
    for now in (1.3, 1.0, 1.499):
        check_form_batch(ch02, [1.0, 1.2], now, 4, 0.5)
    for now in (1.5, 1.7, 9.0):
        check_form_batch(ch02, [1.0, 1.2], now, 4, 0.5)
    check_form_batch(ch02, [2.0], 2.0, 8, 0.0)


@pytest.mark.hint("Nobody waiting: return (0, None).")
def test_form_batch_with_nobody_waiting(ch02):
    check_form_batch(ch02, [], 5.0, 4, None)
    check_form_batch(ch02, [], 5.0, 4, 0.5)


@pytest.mark.hint("Check each case of form_batch's docstring in order: nobody waiting, full or no delay, then the deadline.")
def test_form_batch_random_cases(ch02):
    rng = random.Random(1)
    for _ in range(300):
        arrivals = sorted(round(rng.uniform(0, 2), 2) for _ in range(rng.randint(0, 6)))
        now = max(arrivals, default=0.0) + round(rng.uniform(0, 1), 2)
        check_form_batch(ch02, arrivals, now, rng.randint(1, 5), rng.choice([None, 0.0, 0.1, 0.5, 1.0]))


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


def run_static_engine(model, scheduler_cls=None):
    """Requests arriving over time in a dynamic batcher: some batches fill up, others time out."""
    arrivals = [0.0, 0.05, 0.1, 0.12, 0.9, 0.95, 2.0, 3.0, 3.01, 3.02, 3.03, 3.04]
    engine = build_engine("static", model, torch.device("cpu"), None, scheduler_cls=scheduler_cls, max_num_seqs=3,
                          max_queue_delay=0.3)
    engine.clock = TickClock()
    requests = [Request(str(i), [3 + i, 4, 5], SamplingParams(max_tokens=1 + i % 3, ignore_eos=True), t)
                for i, t in enumerate(arrivals)]
    for r in requests:
        engine.add_request(r)
    for _ in engine.run():
        pass
    return requests, engine.trace


@pytest.fixture(scope="module")
def model():
    return LLM("tiny", dtype="float32", device="cpu").model


@pytest.mark.hint("Your form_batch drives the dynamic batcher here: its batches and start times must match minillm's.")
def test_form_batch_drives_the_dynamic_batcher(ch02, model):
    got, trace = run_static_engine(model, ch02.FormBatchScheduler)
    expected, expected_trace = run_static_engine(model)
    assert trace.column("admitted_ids") == expected_trace.column("admitted_ids"), (
        f"batches started: expected {[a for a in expected_trace.column('admitted_ids') if a]}, "
        f"got {[a for a in trace.column('admitted_ids') if a]}")
    for r, e in zip(got, expected):
        assert math.isclose(r.metrics.first_scheduled_time, e.metrics.first_scheduled_time), (
            f"request {r.request_id} (arrived {r.metrics.arrival_time}) started at {r.metrics.first_scheduled_time:.2f}, "
            f"expected {e.metrics.first_scheduled_time:.2f}")
