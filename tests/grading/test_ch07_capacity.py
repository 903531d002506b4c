"""Grading tests for chapter 7 (``request_is_good`` and ``find_max_rate``).

The learner's functions run in a child process (``minillm.course.sandbox``); no function crosses
the boundary, so the ``run_*`` probes build what the learner's code is given there from plain data:
a made-up ``is_met`` from a capacity (``rate <= capacity``), which records every rate it is called
with, so the tests here can check the answer, the number of calls and their range. The last test
runs the learner's search inside ``minillm.capacity.find_capacity`` on the simulator and compares
its answer with the tool's own search (``search_max_rate``). ``request_is_good`` is checked on
hand-made requests, each telling one rule apart, then against ``minillm.capacity.request_is_good``
on the requests of a simulated run.
"""

import math
from functools import cache

import pytest

from minillm.capacity import (
    RequestResult,
    at_rate,
    base_workload,
    find_capacity,
    parse_slos,
    request_is_good,
    simulator_target,
)
from minillm.course.sandbox import LearnerProcess, type_name

INF = float("inf")


# The last rung of each test's hint ladder (check(..., hint=N)): the idea, never the code. A test
# gets the idea of the longest key in its name, else the "*" one.
IDEAS = {
    "find_max_rate": (
        "The idea: raise the rate geometrically from one that passes until one fails, then narrow the bracket "
        "between the last pass and the first failure until it is within rel_tol; is_met is expensive, so call "
        "it no more than that takes."
    ),
    "your_search": (
        "The idea: raise the rate geometrically from one that passes until one fails, then narrow the bracket "
        "between the last pass and the first failure until it is within rel_tol; is_met is expensive, so call "
        "it no more than that takes."
    ),
    "request_is_good": (
        "The idea: a request is good when each metric that has a target (TTFT, mean inter-token gap, end-to- "
        "end) is at or under it; a metric with no target, or with no value (one token has no gaps), cannot "
        "fail it."
    ),
}


@pytest.fixture(scope="module")
def ch07():
    with LearnerProcess("ch07_capacity") as learner:
        yield learner


class TooManyCalls(Exception):
    """Raised by the made-up ``is_met`` past its call limit, so that a grid (or a loop that never
    ends) stops at once and is reported as too many calls."""


# --- probes: these run in the learner's process ------------------------------------------------
def run_find_max_rate(ch07, capacity, low, high, rel_tol=None, limit=1000):
    """``find_max_rate`` on ``is_met(rate) = rate <= capacity`` (``inf``: every rate passes; below
    ``low``: none does). Returns the answer and every ``(rate, is_met's answer)`` in call order."""
    calls = []

    def is_met(rate):
        if len(calls) >= limit:
            raise TooManyCalls
        calls.append((rate, rate <= capacity))
        return rate <= capacity

    args = (is_met, low, high) if rel_tol is None else (is_met, low, high, rel_tol)
    try:
        result = ch07.find_max_rate(*args)
    except TooManyCalls:
        return {"result": None, "calls": calls, "stopped": True}
    return {"result": result, "calls": calls, "stopped": False}


def run_request_is_good(ch07, requests, slos):
    """``request_is_good`` on each ``(ttft, itls, e2e)`` of ``requests``, with the same ``slos``."""
    return [ch07.request_is_good(ttft, list(itls), e2e, dict(slos)) for ttft, itls, e2e in requests]


def run_find_capacity_with_your_search(ch07, limit, **kwargs):
    """The capacity tool with your ``find_max_rate`` as its search: its answer and the rates it
    tried, in order; stopped after ``limit`` benchmarks (a grid would run for minutes)."""
    tried = []

    def your_search(is_met, low, high, rel_tol):
        def counted(rate):
            if len(tried) >= limit:
                raise TooManyCalls
            met = is_met(rate)
            tried.append((rate, met))
            return met

        return ch07.find_max_rate(counted, low, high, rel_tol)

    try:
        result = find_capacity(search=your_search, **kwargs)
    except TooManyCalls:
        return {"max_rate": None, "tried": tried, "stopped": True}
    return {"max_rate": result.max_rate, "tried": tried, "stopped": False}


# --- checks: these run here --------------------------------------------------------------------
REL_TOL = 0.05


def max_calls(low, high, rel_tol=REL_TOL) -> float:
    """The docstring's budget of ``is_met`` calls."""
    return math.log2(high / low) + math.log2(1 / rel_tol) + 4


def search(ch07, capacity, low, high, rel_tol=None, limit=1000) -> dict:
    got = ch07.call(run_find_max_rate, capacity, low, high, rel_tol, limit)
    got["case"] = (
        f"find_max_rate(is_met, low={low:g}, high={high:g}"
        + ("" if rel_tol is None else f", rel_tol={rel_tol:g}")
        + f") with capacity {capacity:g} "
        f"(is_met(rate) is rate <= {capacity:g})"
    )
    got["rates"] = [rate for rate, _ in got["calls"]]
    assert not got["stopped"], (
        f"{got['case']}: is_met was called {limit} times and the search had not ended; "
        f"the first rates: {rounded(got['rates'][:12])}"
    )
    return got


def rounded(rates) -> list:
    return [round(r, 4) if isinstance(r, float) else r for r in rates]


def assert_is_a_number(got):
    result = got["result"]
    assert isinstance(result, (int, float)) and not isinstance(result, bool), (
        f"{got['case']}: return a rate (a float), got {type_name(result)}: {result!r}"
    )


def assert_passed(got):
    """The answer is a rate ``is_met`` was called with and said True to."""
    assert_is_a_number(got)
    result, calls = got["result"], got["calls"]
    failed = [rate for rate, met in calls if not met]
    assert result not in failed, (
        f"{got['case']}: returned {result:g}, a rate is_met said False to: the capacity "
        f"is below it (rates tried: {rounded(got['rates'])})"
    )
    assert any(rate == result and met for rate, met in calls), (
        f"{got['case']}: returned {result:g}, which is_met was never called with; return a rate it said True to "
        f"(rates tried: {rounded(got['rates'])})"
    )


def assert_within_rel_tol(got, capacity, rel_tol):
    assert_passed(got)
    result = got["result"]
    assert result * (1 + rel_tol) * (1 + 1e-9) > capacity, (
        f"{got['case']}: returned {result:g}, more than rel_tol={rel_tol:g} below the capacity: "
        f"{result:g} * (1 + {rel_tol:g}) = {result * (1 + rel_tol):g} is not above {capacity:g} "
        f"(rates tried: {rounded(got['rates'])})"
    )


@pytest.mark.points(2)
@pytest.mark.hint(
    "Return the LOWER end of the final bracket: the last rate is_met said True to. Its upper end "
    "failed (the capacity is below it), and a rate inside it you never tried is a guess."
)
def test_find_max_rate_returns_a_rate_that_passed(ch07):
    for capacity, low, high in [(10, 1, 64), (3.3, 0.5, 100), (47, 1, 512), (0.37, 0.1, 512)]:
        assert_passed(search(ch07, capacity, low, high, REL_TOL))


@pytest.mark.points(2)
@pytest.mark.hint(
    "Halve the bracket [lo passed, hi failed] until hi <= lo * (1 + rel_tol), a RELATIVE width "
    "(hi - lo <= rel_tol is too coarse at low rates): the answer lo is then within rel_tol of the capacity."
)
def test_find_max_rate_is_within_rel_tol(ch07):
    for capacity, low, high, rel_tol in [
        (10, 1, 64, 0.05),
        (0.3, 0.1, 512, 0.05),
        (0.23, 0.1, 512, 0.01),
        (123.4, 1, 512, 0.01),
        (5.5, 1, 64, 0.2),
        (0.9, 0.5, 2, 0.001),
    ]:
        assert_within_rel_tol(search(ch07, capacity, low, high, rel_tol), capacity, rel_tol)
    assert_within_rel_tol(search(ch07, 7.7, 1, 64), 7.7, REL_TOL)  # rel_tol's default is 0.05


@pytest.mark.points(2)
@pytest.mark.hint(
    "Each is_met call is a whole benchmark run: search, don't step through a grid. Double the rate "
    "from low until one fails, then halve the bracket: at most log2(high/low) + log2(1/rel_tol) + 4 calls."
)
def test_find_max_rate_calls_is_met_few_times(ch07):
    for capacity, low, high, rel_tol in [
        (10, 1, 64, 0.05),
        (300, 0.1, 512, 0.05),
        (0.37, 0.1, 512, 0.05),
        (55, 1, 100, 0.01),
        (3, 1, 1000, 0.1),
    ]:
        budget = max_calls(low, high, rel_tol)
        got = ch07.call(run_find_max_rate, capacity, low, high, rel_tol, int(budget) + 1)
        case = f"find_max_rate(is_met, low={low:g}, high={high:g}, rel_tol={rel_tol:g}) with capacity {capacity:g}"
        assert not got["stopped"] and len(got["calls"]) <= budget, (
            f"{case}: called is_met {'more than ' if got['stopped'] else ''}{len(got['calls'])} times, more than "
            f"log2(high/low) + log2(1/rel_tol) + 4 = {budget:.1f}; rates tried: "
            f"{rounded([r for r, _ in got['calls']][:20])}" + (" ..." if len(got["calls"]) > 20 else "")
        )


@pytest.mark.hint(
    "When is_met(low) is False not even the lowest rate meets the targets: return None "
    "(not low, not 0), without calling is_met again."
)
def test_find_max_rate_none_when_even_low_fails(ch07):
    for capacity, low, high in [(0.5, 1, 64), (0, 0.1, 512), (2.99, 3, 4)]:
        got = search(ch07, capacity, low, high, REL_TOL)
        assert got["result"] is None, f"{got['case']}: is_met(low) is False: expected None, got {got['result']!r}"
        assert len(got["calls"]) == 1, (
            f"{got['case']}: is_met(low) is False: one call is enough, got {rounded(got['rates'])}"
        )


@pytest.mark.points(2)
@pytest.mark.hint(
    "Test high itself (cap the doubling at high: min(2 * lo, high)): when is_met(high) is True return "
    "high, not the last doubling below it; when it fails, the capacity is between that doubling and high."
)
def test_find_max_rate_at_the_top_of_the_range(ch07):
    for low, high in [(1, 64), (1, 10), (0.1, 512), (3, 4)]:
        for capacity in (INF, high):
            got = search(ch07, capacity, low, high, REL_TOL)
            assert got["result"] == high, (
                f"{got['case']}: every rate up to high passes: expected high = {high:g}, "
                f"got {got['result']!r} (rates tried: {rounded(got['rates'])})"
            )
    for capacity, low, high in [(9, 1, 10), (9.9, 1, 10), (500, 0.1, 512)]:
        assert_within_rel_tol(search(ch07, capacity, low, high, REL_TOL), capacity, REL_TOL)


@pytest.mark.hint(
    "Call is_met only with rates in [low, high]: cap each doubling at high (min(2 * lo, high)); "
    "a benchmark outside the range was not asked for."
)
def test_find_max_rate_stays_in_the_range(ch07):
    for capacity, low, high in [(INF, 1, 10), (9.5, 1, 10), (10, 1, 64), (700, 0.1, 512), (0.37, 0.1, 512)]:
        got = search(ch07, capacity, low, high, REL_TOL)
        outside = [r for r in got["rates"] if not (isinstance(r, (int, float)) and low <= r <= high)]
        assert not outside, f"{got['case']}: called is_met with {rounded(outside)}, outside [{low:g}, {high:g}]"


# The tool on the simulator: the chunked engine on the H200 profile (its default 16 sequences), 200
# requests per rate (about a tenth of a second each). TTFT p95 crosses its 0.5 s target between 9.28
# and 9.62 req/s (the tool answers 9.51): an SLO sets the capacity, and no rate fails by the overload
# test alone. Met or not is monotone in the rate here (checked on a grid of ratio 1.036 from 1 to
# 64 req/s: met up to 9.28, failed from 9.62 on), so any correct search lands within rel_tol of the
# tool's answer.
CAPACITY_RUN = dict(
    engine="chunked",
    slo=["ttft_p95=0.5", "itl_p95=0.05"],
    num_requests=200,
    rate_range=(1, 64),
    rel_tol=REL_TOL,
    seed=0,
)


@cache
def tools_capacity() -> float:
    return find_capacity(**CAPACITY_RUN).max_rate


@pytest.mark.points(3)
@pytest.mark.hint(
    "Inside find_capacity(..., search=find_max_rate) your search must find the capacity the tool's own "
    "search_max_rate finds, within rel_tol: the rate it returns met every SLO, and a rate (1 + rel_tol) above it did "
    "not."
)
def test_your_search_sizes_the_simulated_endpoint(ch07):
    low, high = CAPACITY_RUN["rate_range"]
    budget = max_calls(low, high, REL_TOL)
    got = ch07.call(run_find_capacity_with_your_search, int(budget) + 1, **CAPACITY_RUN)
    expected = tools_capacity()
    mine, tried = got["max_rate"], got["tried"]
    case = (
        f'find_capacity("chunked", {CAPACITY_RUN["slo"]}, num_requests=200, rate_range=(1, 64), search=find_max_rate)'
    )
    assert not got["stopped"], (
        f"{case}: stopped at benchmark {len(tried) + 1} (call of is_met), more than "
        f"log2(high/low) + log2(1/rel_tol) + 4 = {budget:.1f}: rates tried {rounded([r for r, _ in tried])}"
    )
    assert isinstance(mine, (int, float)) and not isinstance(mine, bool), (
        f"{case}: max_rate should be a rate, got {mine!r}"
    )
    assert (mine, True) in [tuple(t) for t in tried], (
        f"{case}: max_rate {mine:g} is not a rate that met every SLO; rates tried (rate, met): "
        f"{[(round(r, 3), m) for r, m in tried]}"
    )
    assert max(mine, expected) <= min(mine, expected) * (1 + REL_TOL), (
        f"{case}: max_rate {mine:.4g} req/s, the tool's own search finds {expected:.4g}: more than rel_tol={REL_TOL} "
        "apart; "
        f"rates tried (rate, met): {[(round(r, 3), m) for r, m in tried]}"
    )


# --- request_is_good ----------------------------------------------------------------------------
def judge(ch07, requests, slos) -> list:
    got = ch07.call(run_request_is_good, requests, slos)
    assert isinstance(got, list) and len(got) == len(requests), f"expected one verdict per request, got {got!r}"
    for request, verdict in zip(requests, got):
        assert type(verdict) is bool, (
            f"request_is_good{(*request, slos)} returned {type_name(verdict)} {verdict!r}: return True or False"
        )
    return got


def assert_verdicts(ch07, cases, slos, why):
    """``cases``: ``((ttft, itls, e2e), expected verdict)`` pairs, all judged on ``slos``."""
    got = judge(ch07, [request for request, _ in cases], slos)
    for (request, expected), verdict in zip(cases, got):
        assert verdict == expected, (
            f"request_is_good({request[0]!r}, {request[1]!r}, {request[2]!r}, {slos!r}) returned "
            f"{verdict}, expected {expected}: {why(request)}"
        )


@pytest.mark.hint(
    "TTFT: the request's own time to first token must be AT MOST slos['ttft'] (<=): equal to the target is good."
)
def test_request_is_good_ttft(ch07):
    slos = {"ttft": 0.5}
    assert_verdicts(
        ch07,
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
def test_request_is_good_itl_is_the_mean_gap(ch07):
    slos = {"itl": 0.05}
    cases = [
        ((0.1, [0.02, 0.02, 0.08], 0.22), True),  # longest gap 0.08 over the target, mean 0.04 under it
        ((0.1, [0.01, 0.12], 0.23), False),  # mean 0.065
        ((0.1, [0.04] * 20, 0.9), True),  # mean 0.04, sum 0.8
        ((0.1, [0.05, 0.05], 0.2), True),  # mean exactly the target
        ((0.1, [0.06], 0.16), False),
    ]
    assert_verdicts(
        ch07, cases, slos, lambda r: f"its gaps {r[1]} have mean {sum(r[1]) / len(r[1]):.4g}, the target is 0.05"
    )


@pytest.mark.hint("e2e: the request's own end-to-end latency (arrival to last token) must be at most slos['e2e'] too.")
def test_request_is_good_e2e(ch07):
    slos = {"ttft": 1.0, "itl": 0.1, "e2e": 2.0}
    cases = [((0.5, [0.05] * 10, 1.0), True), ((0.9, [0.09] * 13, 2.07), False), ((0.9, [0.09] * 12, 1.98), True)]
    assert_verdicts(
        ch07, cases, slos, lambda r: f"TTFT {r[0]:g} and mean ITL meet their targets; e2e {r[2]:g} against 2.0"
    )


@pytest.mark.hint(
    "Check only the metrics slos names: a metric with no target (absent from the dict) cannot break "
    "(use `if 'itl' in slos`, not slos['itl'] or a default of 0)."
)
def test_request_is_good_ignores_metrics_without_a_target(ch07):
    request = (0.2, [0.3] * 16, 5.0)  # TTFT good, slow tokens, very long
    for slos in ({"ttft": 0.5}, {"ttft": 0.5, "e2e": 10.0}, {"e2e": 6}):
        assert_verdicts(ch07, [(request, True)], slos, lambda r: "no target that this request breaks")
    assert_verdicts(ch07, [(request, False)], {"ttft": 0.5, "itl": 0.1}, lambda r: "its mean gap 0.3 is over 0.1")
    assert_verdicts(ch07, [(request, True)], {}, lambda r: "no SLO at all: nothing to break")


@pytest.mark.hint(
    "A one-token request has no gaps (itls == []): it meets any ITL target. Don't divide by len(itls) = 0, "
    "and don't compare NaN (NaN <= target is False); its TTFT and e2e still count."
)
def test_request_is_good_one_token_request(ch07):
    slos = {"ttft": 0.5, "itl": 0.05, "e2e": 1.0}
    cases = [((0.3, [], 0.3), True), ((0.8, [], 0.8), False), ((0.01, [], 0.01), True)]
    assert_verdicts(ch07, cases, slos, lambda r: f"one token: no gaps, TTFT = e2e = {r[0]:g}")


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
def test_request_is_good_agrees_with_the_tools_goodput(ch07):
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
        got = judge(ch07, requests, slos)
        wrong = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
        assert not wrong, (
            f"slos {slos}: {len(wrong)} of {len(requests)} simulated requests judged wrong, e.g. the request "
            f"with {describe(requests[wrong[0]])}: yours says {got[wrong[0]]}, expected {expected[wrong[0]]}"
        )
