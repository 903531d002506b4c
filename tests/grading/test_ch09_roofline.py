"""Grading tests for chapter 9 (``decode_step_floor`` and ``crossover_batch``).

The learner's functions run in a child process (``minillm.course.sandbox``); the ``run_*`` probes
call them there and return plain data. Every expected figure is worked out here, in exact
arithmetic (``fractions.Fraction``) where a boundary is decided: each test looks at one part of the
roofline (the FLOPs, the weights' bytes, the caches' bytes, the slower of the two, the crossover
with and without caches, the batch that never comes, the solving), so that its hint can name the
mistake it caught. The made-up models and devices are chosen so that the answers are exact in
floating point too, or far from a tie.
"""

import random
from fractions import Fraction

import pytest

from minillm.course.sandbox import LearnerProcess, type_name

# The last rung of each test's hint ladder (check(..., hint=N)): the idea, never the code. A test
# gets the idea of the longest key in its name, else the "*" one.
IDEAS = {
    "floor": (
        "The idea: a step lasts as long as the slower of its FLOPs at the device's FLOP rate and its bytes at "
        "the device's bandwidth; FLOPs grow with the batch's tokens, bytes are the weights once plus every "
        "request's cache."
    ),
    "crossover": (
        "The idea: compute time grows with the batch faster than memory time (only the caches grow with it); "
        "solve for the batch at which compute time reaches memory time, and take the first whole batch at or "
        "past it."
    ),
}


@pytest.fixture(scope="module")
def ch09():
    with LearnerProcess("ch09_roofline") as learner:
        yield learner


# --- probes: these run in the learner's process ------------------------------------------------
def run_floor(ch09, cases):
    """``decode_step_floor`` on each ``(num_params, bytes_per_param, kv_bytes_per_token, batch_size,
    context_len, peak_flops, memory_bandwidth)``."""
    return [ch09.decode_step_floor(*case) for case in cases]


def run_crossover(ch09, cases):
    """``crossover_batch`` on each ``(num_params, bytes_per_param, kv_bytes_per_token, context_len,
    peak_flops, memory_bandwidth)``."""
    return [ch09.crossover_batch(*case) for case in cases]


# --- checks: these run here --------------------------------------------------------------------
def floors(ch09, cases) -> list[dict]:
    got = ch09.call(run_floor, cases)
    for case, g in zip(cases, got):
        assert isinstance(g, dict), f"decode_step_floor{case} returned {type_name(g)}, not a dict"
        missing = {"flops", "bytes", "seconds", "bound"} - set(g)
        assert not missing, f"decode_step_floor{case} returned a dict without {sorted(missing)}"
    return got


def is_compute_bound(case, batch: int) -> bool:
    """Exactly: does a decode step of ``batch`` requests spend at least as long computing as reading?"""
    params, per_param, kv, context, peak, bandwidth = (Fraction(x) for x in case)
    return 2 * params * batch / peak >= (params * per_param + batch * context * kv) / bandwidth


def crossovers(ch09, cases, timeout=None) -> list:
    got = ch09.call(run_crossover, cases, timeout=timeout)
    for case, g in zip(cases, got):
        assert g is None or (isinstance(g, int) and not isinstance(g, bool)), (
            f"crossover_batch{case} returned {g!r} ({type_name(g)}): a batch size is an int, or None"
        )
    return got


def assert_crossovers(ch09, cases) -> None:
    for case, got in zip(cases, crossovers(ch09, cases)):
        want = smallest_compute_bound(case)
        assert got == want, f"crossover_batch{case}: {got!r}, expected {want}"


A_GPU = (9.89e14, 4.25e12)  # peak FLOP/s and bytes/s of a made-up GPU (an H200's datasheet FLOP/s, bandwidth measured)
A_CPU = (2.23e11, 1.9e10)  # and of a made-up CPU (a 2-core cloud machine's, measured)


@pytest.mark.hint(
    "a step does one multiply and one add per weight for each token it computes: 2 * num_params FLOPs for each "
    "request of the batch"
)
def test_floor_counts_two_flops_per_parameter_per_token(ch09):
    cases = [(1_000, 2, 0, b, 0, 1e6, 1e6) for b in (1, 2, 7, 64)] + [(596_049_920, 2, 114_688, 3, 100, *A_GPU)]
    for case, got in zip(cases, floors(ch09, cases)):
        assert got["flops"] == pytest.approx(2 * case[0] * case[3], rel=1e-12), (
            f"decode_step_floor{case}: flops {got['flops']!r}, expected {2 * case[0] * case[3]:,}"
        )


@pytest.mark.hint(
    "the weights are read once per step, whatever the batch: the requests share each read, so they add "
    "num_params * bytes_per_param bytes once, not once per request"
)
def test_floor_reads_the_weights_once_for_the_whole_batch(ch09):
    cases = [(1_000, 2, 0, b, 0, 1e6, 1e6) for b in (1, 8, 64)] + [(135_000_000, 4, 0, 32, 0, *A_CPU)]
    for case, got in zip(cases, floors(ch09, cases)):
        assert got["bytes"] == pytest.approx(case[0] * case[1], rel=1e-12), (
            f"decode_step_floor{case} (no KV cache): bytes {got['bytes']!r}, expected the weights "
            f"alone, {case[0] * case[1]:,}"
        )


@pytest.mark.hint(
    "each request reads its own cache: context_len cached tokens of kv_bytes_per_token bytes each, for every "
    "request of the batch, on top of the weights"
)
def test_floor_adds_every_requests_kv_cache(ch09):
    cases = [(1_000, 2, 10, 4, 25, 1e6, 1e6), (596_049_920, 2, 114_688, 256, 1024, *A_GPU), (1_000, 2, 3, 1, 7, 1, 1)]
    for case, got in zip(cases, floors(ch09, cases)):
        params, per_param, kv, batch, context = case[:5]
        want = params * per_param + batch * context * kv
        assert got["bytes"] == pytest.approx(want, rel=1e-12), (
            f"decode_step_floor{case}: bytes {got['bytes']!r}, expected {want:,} (weights "
            f"{params * per_param:,} + {batch} requests x {context} tokens x {kv} bytes)"
        )


@pytest.mark.points(2)
@pytest.mark.hint(
    "the step lasts as long as the slower of its arithmetic (flops / peak_flops) and its memory traffic "
    "(bytes / memory_bandwidth), not their sum; bound names the slower, and a tie is 'compute'"
)
def test_floor_is_the_slower_of_compute_and_memory(ch09):
    cases = [
        (1_000, 2, 0, 1, 0, 1_000, 1_000),  # the docstring's example: a tie
        (1_000, 2, 0, 1, 0, 1e6, 1e3),  # memory: 2 s against 0.002 s
        (1_000, 2, 0, 1, 0, 1e3, 1e6),  # compute: 2 s against 0.002 s
        (1_000, 2, 10, 4, 25, 1e6, 1e6),  # memory, the cache's share deciding it
        (596_049_920, 2, 114_688, 256, 1024, *A_GPU),
        (596_049_920, 2, 0, 512, 0, *A_GPU),
    ]
    for case, got in zip(cases, floors(ch09, cases)):
        params, per_param, kv, batch, context, peak, bandwidth = case
        compute_s = 2 * params * batch / peak
        memory_s = (params * per_param + batch * context * kv) / bandwidth
        want = "compute" if is_compute_bound((params, per_param, kv, context, peak, bandwidth), batch) else "memory"
        assert got["seconds"] == pytest.approx(max(compute_s, memory_s), rel=1e-9), (
            f"decode_step_floor{case}: seconds {got['seconds']!r}, expected {max(compute_s, memory_s):g} "
            f"(compute {compute_s:g} s, memory {memory_s:g} s)"
        )
        assert got["bound"] == want, (
            f"decode_step_floor{case}: bound {got['bound']!r}, expected {want!r} "
            f"(compute {compute_s:g} s, memory {memory_s:g} s)"
        )


@pytest.mark.points(2)
@pytest.mark.hint(
    "with no cache, every request adds 2 * num_params FLOPs and no bytes: the answer is the smallest whole batch "
    "whose compute time reaches the weights' read time (round up, and never below 1)"
)
def test_crossover_without_a_cache(ch09):
    cases = [
        (1_000, 2, 0, 0, 100_000, 1_000),  # the docstring's example: 100
        (1_024, 2, 0, 0, 131_072, 1_024),  # 2 s of reads, 1/64 s of arithmetic per request: 128, a tie
        (1_024, 2, 0, 0, 262_144, 1_024),  # 256, a tie
        (1_000, 2, 0, 0, 333_333, 1_000),  # 333.3...: 334
        (1_000, 2, 0, 0, 100_000 * 3, 1_024),  # 292.96...: 293
        (1_000, 2, 0, 0, 1_000, 1_000_000),  # compute-bound from the first request: 1
        (596_049_920, 2, 0, 0, *A_GPU),
        (135_000_000, 4, 0, 0, *A_CPU),
    ]
    assert_crossovers(ch09, cases)


@pytest.mark.points(2)
@pytest.mark.hint(
    "each request also reads its own cache, so it adds memory time as well as compute time: only the difference "
    "between the two pays back the weights' read time"
)
def test_crossover_with_a_cache(ch09):
    cases = [
        (1_024, 2, 1, 8, 131_072, 1_024),  # each request: 1/64 s of FLOPs, 1/128 s of reads: 256, a tie
        (1_000, 2, 1, 10, 110_000, 1_000),
        (596_049_920, 2, 114_688, 16, *A_GPU),
        (596_049_920, 2, 114_688, 4, *A_GPU),
        (135_000_000, 4, 18_432, 100, *A_CPU),
    ]
    assert_crossovers(ch09, cases)


@pytest.mark.points(2)
@pytest.mark.hint(
    "when each request's cache takes at least as long to read as its token takes to compute, no batch size is "
    "compute-bound: return None (not 0, a negative number, infinity or a huge batch)"
)
def test_crossover_none_when_the_cache_costs_as_much_as_the_arithmetic(ch09):
    cases = [
        (1_000, 2, 1, 20, 100_000, 1_000),  # the docstring's example: 0.02 s and 0.02 s
        (1_000, 2, 1, 50, 100_000, 1_000),
        (596_049_920, 2, 114_688, 256, *A_GPU),  # Qwen3-0.6B's shape, 256 tokens of context, on the GPU
        (135_000_000, 4, 18_432, 4_096, *A_CPU),
    ]
    for case, got in zip(cases, crossovers(ch09, cases)):
        assert got is None, f"crossover_batch{case}: {got!r}, expected None: {why_never(case)}"


@pytest.mark.points(2)
@pytest.mark.hint(
    "an answer off by one: the crossover is the smallest batch that is compute-bound (a tie counts), so the batch "
    "one below it must still be memory-bound"
)
def test_crossover_is_the_first_compute_bound_batch(ch09):
    rng = random.Random(8)
    cases = []
    while len(cases) < 200:
        case = (
            rng.randrange(10**5, 10**10),
            rng.choice((1, 2, 4)),
            rng.randrange(0, 200_000),
            rng.randrange(0, 4_096),
            10 ** rng.uniform(10, 15.5),
            10 ** rng.uniform(9.5, 12.8),
        )
        want = smallest_compute_bound(case)
        if want is not None and want < 10**7 and not near_a_tie(case, want):
            cases.append(case)
    assert_crossovers(ch09, cases)


@pytest.mark.hint(
    "solve for the batch size from the two times instead of trying batch sizes one after another: here the answer "
    "is in the billions"
)
def test_crossover_is_solved_not_searched(ch09):
    cases = [(1_000, 2, 0, 0, 1e15, 3), (10**9, 2, 1, 1, 1e18, 1.1e9)]
    got = crossovers(ch09, cases, timeout=10)
    for case, g in zip(cases, got):
        want = smallest_compute_bound(case)
        assert want > 10**8 and g == want, f"crossover_batch{case}: {g!r}, expected {want}"


# --- the expected answers, exactly ---------------------------------------------------------------
def smallest_compute_bound(case) -> int | None:
    """The first batch at which ``is_compute_bound``, from the exact crossing point."""
    params, per_param, kv, context, peak, bandwidth = (Fraction(x) for x in case)
    weights_s = params * per_param / bandwidth
    per_request_s = 2 * params / peak - context * kv / bandwidth
    if per_request_s <= 0:
        return None
    batch = max(1, -(-weights_s // per_request_s))  # ceil, exactly
    assert is_compute_bound(case, batch) and (batch == 1 or not is_compute_bound(case, batch - 1))
    return int(batch)


def near_a_tie(case, batch: int) -> bool:
    """Whether the crossing point is within a part in 10^9 of a whole batch: float arithmetic may
    round either way there, so the random cases leave such cases out."""
    params, per_param, kv, context, peak, bandwidth = (Fraction(x) for x in case)
    crossing = (params * per_param / bandwidth) / (2 * params / peak - context * kv / bandwidth)
    return abs(crossing - round(crossing)) < Fraction(1, 10**9) * max(crossing, 1)


def why_never(case) -> str:
    params, per_param, kv, context, peak, bandwidth = case
    return f"each request adds {2 * params / peak:g} s of arithmetic and {context * kv / bandwidth:g} s of cache reads"
