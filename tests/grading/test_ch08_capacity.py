"""Grading tests for chapter 8 (``request_is_good``, ``measured_slice`` and ``queue_grew``).

The learner's functions run in a child process (``minillm.course.sandbox``) and get plain data.
Each function is checked on hand-made cases, each telling one rule apart, then on runs of the
simulated H200 endpoint against ``minillm.capacity``'s own judgement (``request_is_good``,
``measured_slice`` and ``is_overloaded`` in ``minillm/capacity/measure.py``).
"""

from functools import cache

import pytest

from minillm.capacity import (
    RequestResult,
    at_rate,
    base_workload,
    parse_slos,
    request_is_good,
    simulator_target,
)
from minillm.capacity.measure import is_overloaded, mean_waiting, measured_slice
from minillm.course.sandbox import LearnerProcess, type_name

# The last rung of each test's hint ladder (check(..., hint=N)): the idea, never the code. A test
# gets the idea of the longest key in its name, else the "*" one.
IDEAS = {
    "request_is_good": (
        "The idea: a request is good when each metric that has a target (TTFT, mean inter-token gap, end-to-end) "
        "is at or under it; a metric with no target, or with no value (one token has no gaps), cannot fail it."
    ),
    "measured_slice": (
        "The idea: count off the warm-up's share of the requests from the front and the cool-down's from the back, "
        "each rounded down; what is left in the middle is measured."
    ),
    "queue_grew": (
        "The idea: the waiting count is a step function of time; its average over an interval is its area there "
        "(count times how long it held, piece by piece) divided by the interval's length. Compare the last "
        "quarter's average with the first's."
    ),
}


@pytest.fixture(scope="module")
def ch08():
    with LearnerProcess("ch08_capacity") as learner:
        yield learner


# --- probes: these run in the learner's process ------------------------------------------------
def run_request_is_good(ch08, requests, slos):
    """``request_is_good`` on each ``(ttft, itls, e2e)`` of ``requests``, with the same ``slos``."""
    return [ch08.request_is_good(ttft, list(itls), e2e, dict(slos)) for ttft, itls, e2e in requests]


def run_measured_slice(ch08, num_requests, warmup, cooldown):
    """The request indices the learner's slice keeps, or the ``ValueError``'s message."""
    try:
        kept = ch08.measured_slice(num_requests, warmup, cooldown)
    except ValueError as err:
        return {"error": str(err)}
    if not isinstance(kept, slice):
        return {"type": type(kept).__name__}
    return {"kept": list(range(num_requests))[kept]}


def run_queue_grew(ch08, cases):
    """``queue_grew`` on each ``(waiting, start, end, num_requests)`` of ``cases``."""
    return [ch08.queue_grew([tuple(p) for p in waiting], start, end, n) for waiting, start, end, n in cases]


# --- measured_slice -----------------------------------------------------------------------------
def check_slices(ch08, cases, why):
    for n, warmup, cooldown in cases:
        got = ch08.call(run_measured_slice, n, warmup, cooldown)
        call = f"measured_slice({n}, {warmup}, {cooldown})"
        assert "type" not in got, f"{call} returned a {got.get('type')}: return a slice"
        assert "error" not in got, f"{call} raised ValueError({got['error']!r}); it leaves requests to measure"
        expected = list(range(n))[measured_slice(n, warmup, cooldown)]
        kept = got["kept"]
        assert kept == expected, (
            f"{call} keeps requests {kept[0] if kept else None}..{kept[-1] if kept else None} ({len(kept)}), "
            f"expected {expected[0]}..{expected[-1]} ({len(expected)}): {why}"
        )


@pytest.mark.hint(
    "Leave out the first warmup * num_requests requests and the last cooldown * num_requests, and keep the rest."
)
def test_measured_slice_leaves_out_warmup_and_cooldown(ch08):
    check_slices(ch08, [(100, 0.1, 0.1), (40, 0.25, 0.0), (40, 0.0, 0.25), (7, 0.0, 0.0)], "the ends left out")


@pytest.mark.hint("A fraction of the requests is rounded DOWN to whole requests (1.35 requests: 1), at each end.")
def test_measured_slice_rounds_down(ch08):
    check_slices(ch08, [(9, 0.15, 0.15), (37, 0.2, 0.05), (3, 0.5, 0.4), (11, 0.09, 0.19)], "fractions round down")


@pytest.mark.hint(
    "warmup and cooldown must each be >= 0 and < 1, and leave requests (their sum < 1); else raise ValueError "
    "naming warmup and cooldown."
)
def test_measured_slice_refuses_fractions_that_leave_nothing(ch08):
    for n, warmup, cooldown in ((10, 0.5, 0.5), (10, -0.1, 0.0), (10, 0.0, 1.0), (10, 0.7, 0.4)):
        got = ch08.call(run_measured_slice, n, warmup, cooldown)
        call = f"measured_slice({n}, {warmup}, {cooldown})"
        assert "error" in got, f"{call} should raise ValueError: no valid run can be measured so, got {got}"
        assert "warmup" in got["error"] and "cooldown" in got["error"], (
            f"{call}: the ValueError should name warmup and cooldown, got {got['error']!r}"
        )


# --- queue_grew ---------------------------------------------------------------------------------
def expected_queue(waiting, start, end, n) -> tuple:
    quarter = (end - start) / 4
    first, last = mean_waiting(waiting, start, start + quarter), mean_waiting(waiting, end - quarter, end)
    return last - first > max(3, 0.05 * n), first, last


def describe_waiting(waiting) -> str:
    if len(waiting) <= 6:
        return str([tuple(p) for p in waiting])
    return f"[{len(waiting)} (time, count) pairs from t={waiting[0][0]:.3g} to {waiting[-1][0]:.3g}]"


def check_queues(ch08, cases, why):
    got = ch08.call(run_queue_grew, cases)
    assert isinstance(got, list) and len(got) == len(cases), f"expected one answer per case, got {got!r}"
    for (waiting, start, end, n), answer in zip(cases, got):
        call = f"queue_grew({describe_waiting(waiting)}, {start:.6g}, {end:.6g}, {n})"
        assert isinstance(answer, tuple | list) and len(answer) == 3, (
            f"{call} returned {type_name(answer)} {answer!r}: return (grew, first, last)"
        )
        grew, first, last = answer
        want_grew, want_first, want_last = expected_queue(waiting, start, end, n)
        quarter = (end - start) / 4
        for name, value, want, (a, b) in (
            ("first", first, want_first, (start, start + quarter)),
            ("last", last, want_last, (end - quarter, end)),
        ):
            assert abs(value - want) <= 1e-9 * max(1, abs(want)), (
                f"{call}: {name} = {value!r}, expected {want!r} (the average over [{a:.6g}, {b:.6g}]): {why}"
            )
        assert type(grew) is bool and grew == want_grew, f"{call}: grew = {grew!r}, expected {want_grew}: {why}"


@pytest.mark.hint(
    "first and last are TIME averages: each count weighs by how long it held within the quarter, not one vote per step."
)
def test_queue_grew_averages_over_time(ch08):
    # Every count here starts inside a quarter, or is 0 when a quarter starts: only the weighting matters.
    spike = [(0.2, 4), (0.4, 1), (0.6, 9), (2.0, 0), (3.1, 2), (3.3, 12)]
    brief = [(0.05, 1), (0.1, 9), (0.2, 1), (2.5, 0), (3.2, 4), (3.5, 12)]
    check_queues(ch08, [(spike, 0.0, 4.0, 40), (brief, 0.0, 4.0, 40)], "time-weighted")


@pytest.mark.hint(
    "A count holds from its own time until the next pair's, also across a quarter's edges; before the first "
    "pair nobody waits, and a pair at or before the quarter's start sets the count it starts with."
)
def test_queue_grew_counts_across_the_quarters_edges(ch08):
    cases = [
        ([(2.0, 5), (8.0, 0)], 0.0, 10.0, 40),  # nothing before t=2; a count running through both quarters' edges
        ([(0.0, 6), (1.0, 7)], 4.0, 8.0, 40),  # every pair before the window: the last one holds throughout
        ([(4.0, 3), (5.0, 1), (7.5, 2)], 4.0, 8.0, 40),  # a pair exactly at start, one inside the last quarter
    ]
    check_queues(ch08, cases, "counts across the edges")


@pytest.mark.hint(
    "grew: last - first must be MORE than 3 requests and more than 5% of num_requests (both), not just positive."
)
def test_queue_grew_needs_more_than_chance(ch08):
    rise = lambda k: [(3.0, k)]  # noqa: E731 -- over [0, 4]: nobody waits through the first quarter, k through the last
    cases = [(rise(3), 0.0, 4.0, 40), (rise(4), 0.0, 4.0, 40), (rise(8), 0.0, 4.0, 200), (rise(11), 0.0, 4.0, 200)]
    check_queues(ch08, cases, "the growth needed is max(3, 5% of the measured requests)")


@cache
def simulated_runs() -> list[tuple]:
    """Two runs of the simulated H200 endpoint (chunked, 300 mixed requests): at 8 req/s the queue
    stays short, at 30 req/s it grows; each trimmed as the tool trims it (10% at each end)."""
    target = simulator_target("chunked", "h200-qwen3-0.6b")
    out = []
    for rate in (8.0, 30.0):
        run = target(at_rate(base_workload("mixed", 300, seed=5), rate))
        ordered = sorted(run.requests, key=lambda r: r.arrival_time)
        measured = ordered[measured_slice(len(ordered), 0.1, 0.1)]
        start, end = measured[0].arrival_time, measured[-1].arrival_time
        verdict = is_overloaded(measured, (start, end), run.waiting)
        out.append(([list(p) for p in run.waiting], start, end, len(measured), verdict))
    return out


@pytest.mark.points(2)
@pytest.mark.hint(
    "On real runs of the simulated endpoint your queue_grew must give the tool's verdict and averages "
    "(minillm.capacity's is_overloaded): below capacity the queue stays flat, past it it grows."
)
def test_queue_grew_judges_simulated_runs_as_the_tool(ch08):
    # A queue that never forms first: answered at once, before the seconds the simulated runs take.
    check_queues(ch08, [([(0.0, 0)], 0.0, 4.0, 40)], "nobody ever waits")
    runs = simulated_runs()
    assert [v[0] for *_, v in runs] == [False, True], "the two runs should be one below capacity and one past it"
    check_queues(ch08, [(w, a, b, n) for w, a, b, n, _ in runs], "as the tool judges the run")


# --- request_is_good ----------------------------------------------------------------------------
def judge(ch08, requests, slos) -> list:
    got = ch08.call(run_request_is_good, requests, slos)
    assert isinstance(got, list) and len(got) == len(requests), f"expected one verdict per request, got {got!r}"
    for request, verdict in zip(requests, got):
        assert type(verdict) is bool, (
            f"request_is_good{(*request, slos)} returned {type_name(verdict)} {verdict!r}: return True or False"
        )
    return got


def assert_verdicts(ch08, cases, slos, why):
    """``cases``: ``((ttft, itls, e2e), expected verdict)`` pairs, all judged on ``slos``."""
    got = judge(ch08, [request for request, _ in cases], slos)
    for (request, expected), verdict in zip(cases, got):
        assert verdict == expected, (
            f"request_is_good({request[0]!r}, {request[1]!r}, {request[2]!r}, {slos!r}) returned "
            f"{verdict}, expected {expected}: {why(request)}"
        )


@pytest.mark.hint(
    "TTFT: the request's own time to first token must be AT MOST slos['ttft'] (<=): equal to the target is good."
)
def test_request_is_good_ttft(ch08):
    slos = {"ttft": 0.5}
    assert_verdicts(
        ch08,
        [
            ((0.2, [0.01], 0.21), True),
            ((0.7, [0.01], 0.71), False),
            ((0.5, [0.01], 0.51), True),
            ((0.5000001, [], 0.5000001), False),
        ],
        slos,
        lambda r: f"its TTFT {r[0]:g} against the target 0.5",
    )


@pytest.mark.points(2)
@pytest.mark.hint(
    "ITL: compare the MEAN of the request's gaps (its time per output token) with slos['itl'], "
    "not its longest gap nor their sum: one slow step does not make a request slow."
)
def test_request_is_good_itl_is_the_mean_gap(ch08):
    slos = {"itl": 0.05}
    cases = [
        ((0.1, [0.02, 0.02, 0.08], 0.22), True),  # longest gap 0.08 over the target, mean 0.04 under it
        ((0.1, [0.01, 0.12], 0.23), False),  # mean 0.065
        ((0.1, [0.04] * 20, 0.9), True),  # mean 0.04, sum 0.8
        ((0.1, [0.05, 0.05], 0.2), True),  # mean exactly the target
        ((0.1, [0.06], 0.16), False),
    ]
    assert_verdicts(
        ch08, cases, slos, lambda r: f"its gaps {r[1]} have mean {sum(r[1]) / len(r[1]):.4g}, the target is 0.05"
    )


@pytest.mark.hint("e2e: the request's own end-to-end latency (arrival to last token) must be at most slos['e2e'] too.")
def test_request_is_good_e2e(ch08):
    slos = {"ttft": 1.0, "itl": 0.1, "e2e": 2.0}
    cases = [((0.5, [0.05] * 10, 1.0), True), ((0.9, [0.09] * 13, 2.07), False), ((0.9, [0.09] * 12, 1.98), True)]
    assert_verdicts(
        ch08, cases, slos, lambda r: f"TTFT {r[0]:g} and mean ITL meet their targets; e2e {r[2]:g} against 2.0"
    )


@pytest.mark.hint(
    "Check only the metrics slos names: a metric with no target (absent from the dict) cannot break "
    "(use `if 'itl' in slos`, not slos['itl'] or a default of 0)."
)
def test_request_is_good_ignores_metrics_without_a_target(ch08):
    request = (0.2, [0.3] * 16, 5.0)  # TTFT good, slow tokens, very long
    for slos in ({"ttft": 0.5}, {"ttft": 0.5, "e2e": 10.0}, {"e2e": 6}):
        assert_verdicts(ch08, [(request, True)], slos, lambda r: "no target that this request breaks")
    assert_verdicts(ch08, [(request, False)], {"ttft": 0.5, "itl": 0.1}, lambda r: "its mean gap 0.3 is over 0.1")
    assert_verdicts(ch08, [(request, True)], {}, lambda r: "no SLO at all: nothing to break")


@pytest.mark.hint(
    "A one-token request has no gaps (itls == []): it meets any ITL target. Don't divide by len(itls) = 0, "
    "and don't compare NaN (NaN <= target is False); its TTFT and e2e still count."
)
def test_request_is_good_one_token_request(ch08):
    slos = {"ttft": 0.5, "itl": 0.05, "e2e": 1.0}
    cases = [((0.3, [], 0.3), True), ((0.8, [], 0.8), False), ((0.01, [], 0.01), True)]
    assert_verdicts(ch08, cases, slos, lambda r: f"one token: no gaps, TTFT = e2e = {r[0]:g}")


@cache
def simulated_requests() -> list[tuple]:
    """The requests of one simulated run past capacity (150 requests at 20 req/s, the H200 profile):
    TTFTs from 3 ms to 1.4 s as the queue builds, mean gaps of 3.4-3.6 ms and longest gaps up to
    4.2 ms; plus two requests of one token."""
    target = simulator_target("chunked", "h200-qwen3-0.6b")
    run = target(at_rate(base_workload("mixed", 150, seed=3), 20.0))
    extra = [RequestResult(0.0, 0.3, [], 0.3), RequestResult(0.0, 0.9, [], 0.9)]
    return [(r.ttft, list(r.itl), r.e2e) for r in run.requests + extra]


def describe(request) -> str:
    ttft, itls, e2e = request
    mean = sum(itls) / len(itls) if itls else float("nan")
    return (
        f"ttft {ttft:.4g}, {len(itls)} gaps of mean {mean:.4g} and longest {max(itls, default=float('nan')):.4g}, "
        f"e2e {e2e:.4g}"
    )


@pytest.mark.points(2)
@pytest.mark.hint(
    "Judge each request on its own numbers, every metric slos names: its TTFT, the mean of its gaps "
    "(none: no ITL to break) and its e2e, each at most its target, as minillm.capacity.request_is_good does."
)
def test_request_is_good_agrees_with_the_tools_goodput(ch08):
    requests = simulated_requests()
    # An ITL target of 3.7 ms: every request's mean gap is under it, a quarter of the longest gaps over it.
    for slos in (
        {"ttft": 0.5, "itl": 0.0037},
        {"ttft": 1.0},
        {"itl": 0.0037, "e2e": 1.5},
        {"itl": 0.00348},
        {"ttft": 1.2, "itl": 0.0036, "e2e": 2.0},
    ):
        parsed = parse_slos({f"{metric}_p50": target for metric, target in slos.items()})
        expected = [request_is_good(RequestResult(0.0, ttft, itls, e2e), parsed) for ttft, itls, e2e in requests]
        assert 0 < sum(expected) < len(expected), f"slos {slos}: the run should hold good and bad requests"
        got = judge(ch08, requests, slos)
        wrong = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
        assert not wrong, (
            f"slos {slos}: {len(wrong)} of {len(requests)} simulated requests judged wrong, e.g. the request "
            f"with {describe(requests[wrong[0]])}: yours says {got[wrong[0]]}, expected {expected[wrong[0]]}"
        )
