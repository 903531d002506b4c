"""Grading tests for chapter 2 (``left_pad`` and ``form_batch``).

The learner's functions run in a child process (``minillm.course.sandbox``): the ``run_*`` probes
below call them there, or run minillm's static engine with the learner's ``LeftPadRunner`` /
``FormBatchScheduler`` plugged in, and return plain data; every check happens here. minillm's static
engine is the oracle: ``minillm.engines.static.left_pad`` and ``minillm.engines.static.form_batch``
are the functions it calls, and the learner's, plugged into the same engine, must make it run
exactly as it runs with its own.
"""

import math
import random
from functools import cache

import pytest
import torch

from minillm import LLM
from minillm.course.sandbox import LearnerProcess, type_name
from minillm.engines import build_engine
from minillm.engines.static import form_batch as engine_form_batch
from minillm.engines.static import left_pad as engine_left_pad
from minillm.request import Request
from minillm.sampling_params import SamplingParams
from minillm.sim.clock import TickClock

EXAMPLE = [[5, 6, 7], [8], [9, 10]]


# The last rung of each test's hint ladder (check(..., hint=N)): the idea, never the code. A test
# gets the idea of the longest key in its name, else the "*" one.
IDEAS = {
    "left_pad": (
        "The idea: every row is as long as the longest prompt; a shorter prompt's row starts with padding, "
        "and its positions count from its first real token, so a prompt sees the same positions in any batch."
    ),
    "form_batch": (
        "The idea: a batch starts when it is full, when there is no delay to wait for, or when the oldest "
        "waiting request has waited max_queue_delay; otherwise the answer is when to look again."
    ),
}


@pytest.fixture(scope="module")
def ch02():
    with LearnerProcess("ch02_batching") as learner:
        yield learner


@cache
def tiny_model():
    """The tiny model, once per process (the grader's and the learner's each load their own)."""
    return LLM("tiny", dtype="float32", device="cpu").model


def run_static_engine(requests, runner_cls=None, scheduler_cls=None, **options) -> dict:
    """``requests`` (prompt, max_tokens, arrival time) through the static engine; what each step and
    request did, as plain data."""
    engine = build_engine(
        "static", tiny_model(), torch.device("cpu"), None, scheduler_cls=scheduler_cls, runner_cls=runner_cls, **options
    )
    engine.clock = TickClock()
    reqs = [
        Request(str(i), prompt, SamplingParams(max_tokens=n, ignore_eos=True), t)
        for i, (prompt, n, t) in enumerate(requests)
    ]
    for r in reqs:
        engine.add_request(r)
    engine.run_to_completion()
    return {
        "admitted": engine.trace.column("admitted_ids"),
        "num_input_tokens": engine.trace.column("num_input_tokens"),
        "tokens": [r.output_token_ids for r in reqs],
        "started": [r.metrics.first_scheduled_time for r in reqs],
    }


# --- probes: these run in the learner's process ------------------------------------------------
def run_left_pad(ch02, batch, pad_id):
    return ch02.left_pad(batch, pad_id)


def run_form_batch(ch02, arrivals, now, max_num_seqs, max_queue_delay):
    return ch02.form_batch(arrivals, now, max_num_seqs, max_queue_delay)


def run_static_engine_with_left_pad(ch02, requests, max_num_seqs):
    return run_static_engine(requests, runner_cls=ch02.LeftPadRunner, max_num_seqs=max_num_seqs)


def run_dynamic_batcher_with_form_batch(ch02, requests, max_num_seqs, max_queue_delay):
    return run_static_engine(
        requests, scheduler_cls=ch02.FormBatchScheduler, max_num_seqs=max_num_seqs, max_queue_delay=max_queue_delay
    )


# --- left_pad -----------------------------------------------------------------------------------
def random_batches(pad_id):
    """The docstring's example, then batches with every row the same length, one row, one-token
    prompts, and random ones; no prompt contains ``pad_id`` (``test_left_pad_pad_id_inside_prompts`` has those)."""
    rng = random.Random(0)
    real = [t for t in range(259) if t != pad_id]
    batches = [EXAMPLE, [[1, 2], [3, 4]], [[7]], [[9] * 5], [[3], [4], [5, 6]]]
    batches += [
        [[rng.choice(real) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 6))] for _ in range(20)
    ]
    return batches


def as_tensor(value, name: str) -> torch.Tensor:
    """A tensor, or a (nested) list or tuple of numbers that makes one: the learner's choice."""
    if isinstance(value, torch.Tensor):
        return value
    assert isinstance(value, (list, tuple)), f"{name} must be a tensor (or nested lists), got {type_name(value)}"
    try:
        return torch.tensor(value)
    except (TypeError, ValueError) as err:
        raise AssertionError(f"{name} must be a [B, T] rectangle of numbers, got {value!r} ({err})") from None


def padded(ch02, batch, pad_id=0):
    """The learner's three tensors for ``batch``, checked for type and shape, and the engine's."""
    got = ch02.call(run_left_pad, batch, pad_id)
    assert isinstance(got, (tuple, list)) and len(got) == 3, (
        f"return a tuple (input_ids, positions, mask), got {type_name(got)}"
    )
    got = [as_tensor(x, name) for x, name in zip(got, ("input_ids", "positions", "mask"))]
    expected = engine_left_pad(batch, pad_id)
    shape = tuple(expected[0].shape)
    for name, tensor in zip(("input_ids", "positions", "mask"), got):
        assert tuple(tensor.shape) == shape, (
            f"batch {batch}: {name} should have shape {shape} (B, longest prompt), got {tuple(tensor.shape)}"
        )
    return got, expected


def left_pad_error(ch02, batch, pad_id, which) -> str | None:
    """What is wrong with the learner's tensor ``which`` (0: input_ids, 1: positions, 2: mask) for
    ``batch``, or None."""
    (got, expected), name = padded(ch02, batch, pad_id), ("input_ids", "positions", "mask")[which]
    if which == 2 and got[2].dtype != torch.bool:
        return f"mask must be a torch.bool tensor (True on real tokens), got {got[2].dtype}"
    if which < 2 and (got[which].is_floating_point() or got[which].dtype == torch.bool):
        return f"{name} must be integers, got {got[which].dtype}"
    if not torch.equal(got[which].long(), expected[which].long()):
        should = f"{name} should be {expected[which].tolist()}, got {got[which].tolist()}"
        return f"left_pad({batch}, pad_id={pad_id}): {should}"
    return None


def check_left_pad(ch02, batch, pad_id, which):
    error = left_pad_error(ch02, batch, pad_id, which)
    assert error is None, error


@pytest.mark.hint(
    "Every row is as wide as the longest prompt; put pad_id in front of the shorter prompts (left padding)."
)
def test_left_pad_input_ids(ch02):
    for pad_id in (0, 258):
        for batch in random_batches(pad_id):
            check_left_pad(ch02, batch, pad_id, 0)


@pytest.mark.hint(
    "positions count 0, 1, 2, ... from each row's first real token (its column minus its number of pads); pads get 0."
)
def test_left_pad_positions(ch02):
    for batch in random_batches(0):
        check_left_pad(ch02, batch, 0, 1)


@pytest.mark.hint("mask is a torch.bool tensor: True on each prompt's real tokens, False on the pads in front of them.")
def test_left_pad_mask(ch02):
    for batch in random_batches(0):
        check_left_pad(ch02, batch, 0, 2)


@pytest.mark.hint(
    "pad_id can also be a real token of a prompt: find the pads by position (the first T - len(prompt) "
    "columns of a row), not by comparing ids with pad_id."
)
def test_left_pad_pad_id_inside_prompts(ch02):
    for which in range(3):
        if left_pad_error(ch02, EXAMPLE, 0, which):
            continue  # wrong even without pad ids inside: the test of that tensor names the mistake
        for batch, pad_id in (([[0, 5, 0], [0]], 0), ([[5, 0], [0, 0, 0], [7]], 0), ([[258, 258], [7, 258, 9]], 258)):
            check_left_pad(ch02, batch, pad_id, which)


@pytest.mark.points(2)
@pytest.mark.hint(
    "Inside the engine, a wrong layout changes the tokens: check left_pad's three tensors against its docstring."
)
def test_left_pad_runs_the_static_engine(ch02):
    prompts = [list(range(3 + i, 3 + i + n)) for i, n in enumerate([5, 17, 2, 11, 8])]
    prompts[2] = [0, 7]  # the engine pads with id 0: a real 0 must stay a real token
    requests = [(p, n, 0.0) for p, n in zip(prompts, [6, 2, 9, 4, 3])]
    got = ch02.call(run_static_engine_with_left_pad, requests, 3)
    expected = run_static_engine(requests, max_num_seqs=3)
    assert got["tokens"] == expected["tokens"], (
        f"the static engine generated other tokens with your left_pad: {got['tokens']}, expected {expected['tokens']}"
    )
    assert got["num_input_tokens"] == expected["num_input_tokens"], (
        f"tokens computed per step {got['num_input_tokens']}, expected {expected['num_input_tokens']}"
    )


# --- form_batch ---------------------------------------------------------------------------------
def check_form_batch(ch02, arrivals, now, max_num_seqs, max_queue_delay):
    got = ch02.call(run_form_batch, list(arrivals), now, max_num_seqs, max_queue_delay)
    expected = engine_form_batch(list(arrivals), now, max_num_seqs, max_queue_delay)
    call = f"form_batch({list(arrivals)}, now={now}, max_num_seqs={max_num_seqs}, max_queue_delay={max_queue_delay})"
    assert isinstance(got, (tuple, list)) and len(got) == 2, f"{call}: return a pair (n, wait_until), got {got!r}"
    n, wait_until = got
    assert isinstance(n, int) and not isinstance(n, bool), f"{call}: n must be an int, got {type_name(n)}"
    assert wait_until is None or isinstance(wait_until, (int, float)), (
        f"{call}: wait_until must be None or a time in seconds, got {type_name(wait_until)}"
    )
    assert n == expected[0] and (wait_until is None) == (expected[1] is None), (
        f"{call} should be {expected}, got {tuple(got)}"
    )
    if wait_until is not None:
        assert math.isclose(wait_until, expected[1]), f"{call} should be {expected}, got {tuple(got)}"


@pytest.mark.hint(
    "A full batch (max_num_seqs or more waiting) starts at once, with max_num_seqs requests, whatever the delay."
)
def test_form_batch_full_batch_starts_at_once(ch02):
    check_form_batch(ch02, [0.0, 0.1], 0.1, 2, 10.0)
    check_form_batch(ch02, [0.0, 0.1, 0.2, 0.3, 0.4], 0.4, 2, 10.0)
    check_form_batch(ch02, [1.0, 1.5, 2.0], 2.0, 3, 0.0)
    check_form_batch(ch02, [1.0], 1.0, 1, 5.0)


@pytest.mark.hint("With max_queue_delay=None, start whatever is waiting right away: min(number waiting, max_num_seqs).")
def test_form_batch_without_delay_starts_what_is_waiting(ch02):
    check_form_batch(ch02, [0.0], 0.0, 4, None)
    check_form_batch(ch02, [0.0, 0.5], 3.0, 4, None)
    check_form_batch(ch02, [0.0] * 6, 0.0, 4, None)


@pytest.mark.hint(
    "A partial batch waits until the OLDEST arrival + max_queue_delay: return (0, that time) before it, "
    "and start (at that very time too) once it has come."
)
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


@pytest.mark.hint(
    "Check each case of form_batch's docstring in order: nobody waiting, full or no delay, then the deadline."
)
def test_form_batch_random_cases(ch02):
    rng = random.Random(1)
    for _ in range(300):
        arrivals = sorted(round(rng.uniform(0, 2), 2) for _ in range(rng.randint(0, 6)))
        now = max(arrivals, default=0.0) + round(rng.uniform(0, 1), 2)
        check_form_batch(ch02, arrivals, now, rng.randint(1, 5), rng.choice([None, 0.0, 0.1, 0.5, 1.0]))


@pytest.mark.points(2)
@pytest.mark.hint("Your form_batch drives the dynamic batcher here: its batches and start times must match minillm's.")
def test_form_batch_drives_the_dynamic_batcher(ch02):
    """Requests arriving over time in a dynamic batcher: some batches fill up, others time out."""
    arrivals = [0.0, 0.05, 0.1, 0.12, 0.9, 0.95, 2.0, 3.0, 3.01, 3.02, 3.03, 3.04]
    requests = [([3 + i, 4, 5], 1 + i % 3, t) for i, t in enumerate(arrivals)]
    got = ch02.call(run_dynamic_batcher_with_form_batch, requests, 3, 0.3)
    expected = run_static_engine(requests, max_num_seqs=3, max_queue_delay=0.3)
    assert got["admitted"] == expected["admitted"], (
        f"batches started: expected {[a for a in expected['admitted'] if a]}, got {[a for a in got['admitted'] if a]}"
    )
    for i, (start, expected_start) in enumerate(zip(got["started"], expected["started"])):
        assert math.isclose(start, expected_start), (
            f"request {i} (arrived {arrivals[i]}) started at {start:.2f}, expected {expected_start:.2f}"
        )
