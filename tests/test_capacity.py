"""The capacity tool (chapter 8): SLOs, the workload, one rate's numbers, the rate search, its CLI and
its plot. Fake targets with a known capacity test the search exactly; the simulator and the tiny
model test that the real paths run and give sane numbers."""

import json
import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.colors import to_rgb

from minillm.capacity import (
    SLO,
    CapacityResult,
    RequestResult,
    TargetRun,
    base_workload,
    capacity_workload,
    check_rate_range,
    find_capacity,
    llm_target,
    measure,
    measured_slice,
    parse_slo,
    parse_slos,
    request_is_good,
    search_max_rate,
    unit_arrivals,
)
from minillm.cli import main

SLOS = ["ttft_p95=0.5", "itl_p95=0.05"]


# --- SLOs and bad input ---------------------------------------------------------------------------


def test_parse_slo_reads_metric_percentile_and_seconds():
    assert parse_slo("ttft_p95=0.5") == SLO("ttft", 95, 0.5)
    assert parse_slo(" itl_p50 = 0.02 ").name == "itl_p50"
    assert str(parse_slo("e2e_p99.9=10")) == "e2e_p99.9=10"
    assert parse_slos({"ttft_p95": 0.5, "itl_p95": "0.05"}) == (SLO("ttft", 95, 0.5), SLO("itl", 95, 0.05))
    assert parse_slos("ttft_p90=1") == (SLO("ttft", 90, 1.0),)
    assert parse_slo("ttft_p0.5=1").percentile == 0.5  # what the error message promises is accepted


@pytest.mark.parametrize(
    "text, names",
    [
        ("tbt_p95=0.5", ["tbt_p95", "unknown metric"]),
        ("ttft=0.5", ["'ttft'", "unknown metric"]),
        ("ttft_p100=0.5", ["ttft_p100", "percentile", "below 100"]),  # a known metric, its percentile out of range
        ("ttft_p0=0.5", ["ttft_p0", "percentile", "above 0"]),
        ("ttft_p95=-1", ["ttft_p95", "> 0"]),
        ("ttft_p95=0", ["ttft_p95", "> 0"]),
        ("ttft_p95=nan", ["ttft_p95", "> 0"]),
        ("itl_p95=fast", ["itl_p95", "number of seconds"]),
        ("ttft_p95", ["METRIC=SECONDS"]),
    ],
)
def test_a_bad_slo_is_a_value_error_that_names_its_field(text, names):
    with pytest.raises(ValueError) as err:
        parse_slo(text)
    for name in names:
        assert name in str(err.value)


def test_no_slo_or_the_same_one_twice_is_refused():
    with pytest.raises(ValueError, match="at least one SLO"):
        parse_slos([])
    with pytest.raises(ValueError, match="ttft_p95 is given 2 times"):
        parse_slos(["ttft_p95=0.5", "ttft_p95=1"])


@pytest.mark.parametrize(
    "rate_range, words",
    [
        ((4, 4), "empty"),
        ((8, 2), "inverted"),
        ((0, 8), "lowest rate"),
        ((-1, 8), "--rate-min"),
        (("a", 8), "two numbers"),
        ((1, math.inf), "highest rate (high, --rate-max)"),
        ((math.nan, 8), "lowest rate"),
    ],
)
def test_an_empty_or_inverted_rate_range_is_refused(rate_range, words):
    with pytest.raises(ValueError, match="rate range") as err:
        check_rate_range(rate_range)
    assert words in str(err.value)
    with pytest.raises(ValueError, match="rate range"):
        find_capacity("chunked", SLOS, rate_range=rate_range)


def test_other_bad_arguments_name_what_is_wrong():
    with pytest.raises(ValueError, match="mix: unknown mix 'emails'"):
        find_capacity("chunked", SLOS, mix="emails")
    with pytest.raises(ValueError, match="num_requests"):
        find_capacity("chunked", SLOS, num_requests=1)
    with pytest.raises(ValueError, match="profile and model"):
        find_capacity("chunked", SLOS, profile="cpu-tiny", model="tiny")
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        find_capacity("chunked", SLOS, max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="burstiness"):
        unit_arrivals(10, burstiness=0)
    with pytest.raises(ValueError, match="target"):
        find_capacity("chunked", SLOS, target=step_target(1.0), max_num_seqs=4)
    with pytest.raises(ValueError, match="warmup"):
        find_capacity("chunked", SLOS, target=step_target(1.0), warmup=0.6, cooldown=0.5)


# --- the workload ---------------------------------------------------------------------------------


def test_every_rate_replays_the_same_requests_compressed_in_time():
    slow, fast = capacity_workload("mixed", 50, rate=2.0, seed=3), capacity_workload("mixed", 50, rate=8.0, seed=3)
    assert slow.prompts == fast.prompts
    assert [p.max_tokens for p in slow.sampling_params] == [p.max_tokens for p in fast.sampling_params]
    assert np.allclose(np.array(slow.arrival_times) / 4, fast.arrival_times)
    assert capacity_workload("mixed", 50, rate=2.0, seed=4).prompts != slow.prompts


def test_bursty_arrivals_keep_the_rate_and_bunch_up():
    def gaps_cv(burstiness):
        gaps = np.diff(unit_arrivals(20000, seed=0, burstiness=burstiness))
        return gaps.mean(), gaps.std() / gaps.mean()

    mean, cv = gaps_cv(1.0)  # Poisson: exponential gaps, CV 1
    assert mean == pytest.approx(1, rel=0.05) and cv == pytest.approx(1, rel=0.05)
    mean, cv = gaps_cv(0.25)  # bursty: CV 2
    assert mean == pytest.approx(1, rel=0.1) and cv == pytest.approx(2, rel=0.1)


# --- one rate -------------------------------------------------------------------------------------


def fake_run(ttfts, itl=0.01, tokens=5, gap=0.1):
    """Requests arriving every ``gap`` seconds with the given TTFTs and a steady ITL."""
    return TargetRun(
        [RequestResult(i * gap, t, [itl] * (tokens - 1), t + itl * (tokens - 1)) for i, t in enumerate(ttfts)]
    )


def test_warm_up_and_cool_down_requests_do_not_count():
    assert measured_slice(100, 0.1, 0.1) == slice(10, 90)
    ttfts = [9.0] * 10 + [0.1] * 80 + [9.0] * 10  # the first and last tenth are slow
    r = measure(fake_run(ttfts), 10.0, parse_slos("ttft_p99=0.2"))
    assert r.met and r.ttft_p95 == pytest.approx(0.1) and r.num_measured == 80
    assert not measure(fake_run(ttfts), 10.0, parse_slos("ttft_p99=0.2"), warmup=0, cooldown=0).met


def test_goodput_counts_requests_that_met_every_slo_of_their_own():
    ttfts = [0.1, 0.9] * 50  # half the requests are slow to start
    r = measure(fake_run(ttfts), 10.0, parse_slos(["ttft_p50=0.6", "itl_p95=0.05"]), warmup=0, cooldown=0)
    assert r.met and r.slo_attainment == pytest.approx(0.5)
    assert r.arrival_rate == pytest.approx(10) and r.goodput == pytest.approx(0.5 * r.arrival_rate)
    slow_tokens = RequestResult(0.0, 0.1, [0.01, 0.2], 0.31)  # TPOT 0.105 s: vLLM's per-request ITL test
    assert not request_is_good(slow_tokens, parse_slos("itl_p95=0.1"))
    assert request_is_good(slow_tokens, parse_slos("itl_p95=0.11"))


def test_throughput_counts_the_tokens_delivered_in_the_window():
    r = measure(fake_run([0.0] * 101, itl=0.01, tokens=5), 10.0, parse_slos("ttft_p95=1"), warmup=0, cooldown=0)
    # 101 requests of 5 tokens over 10 s, the last request's 4 later tokens after the window
    assert r.output_tokens_per_s == pytest.approx((101 * 5 - 4) / 10)
    assert r.requests_per_s == pytest.approx(100 / 10)
    assert not r.overloaded and r.waiting_over_time is None and r.max_waiting is None


def fifo_run(arrivals, service):
    """One server, first come first served, ``service`` seconds a request, one token each."""
    requests, free_at = [], 0.0
    for t in arrivals:
        free_at = max(free_at, t) + service
        requests.append(RequestResult(t, free_at - t, [], free_at - t))
    return TargetRun(requests)


def test_a_queue_that_keeps_growing_is_overload():
    arrivals = unit_arrivals(400, seed=0)
    slo = parse_slos("e2e_p95=1000")
    assert not measure(fifo_run(arrivals / 5, 0.1), 5, slo).overloaded  # half loaded
    r = measure(fifo_run(arrivals / 20, 0.1), 20, slo)  # twice what it can serve
    assert r.overloaded and not r.met and r.violations == ["overload"]
    assert r.waiting_start is None and r.ttft_end > 2 * r.ttft_start  # no queue reported: judged by TTFT's trend
    assert r.in_system_end - r.in_system_mid > 50


def long_run(n=100, gap=0.1, e2e=100.0, waiting=True, ttft=lambda i: 0.01):
    """``n`` requests every ``gap`` s, each lasting ``e2e`` s (far longer than the run's arrivals):
    a stable engine whose running batch is still filling, with an empty queue when ``waiting``."""
    requests = [RequestResult(i * gap, ttft(i), [(e2e - ttft(i)) / 9] * 9, e2e) for i in range(n)]
    return TargetRun(requests, [(i * gap + 0.05, 0) for i in range(n)] if waiting else None)


def test_requests_that_outlast_the_window_are_not_overload():
    slo = parse_slos("e2e_p95=1000")
    for waiting in (True, False):
        r = measure(long_run(waiting=waiting), 10, slo)
        assert r.in_system_end - r.in_system_mid > 30  # what the old rule (in system growing) flagged
        assert not r.overloaded and r.met
    assert measure(long_run(), 10, slo).waiting_start == 0 == measure(long_run(), 10, slo).waiting_end


def test_a_run_shorter_than_its_requests_carries_a_caution():
    slo = parse_slos("e2e_p95=1000")
    short = CapacityResult(10, slo, [measure(long_run(), 10, slo)], num_requests=100)  # 8 s of arrivals, 100 s requests
    assert "caution" in short.summary() and "raise --num-requests" in short.summary()
    steady = CapacityResult(10, slo, [measure(long_run(e2e=2.0), 10, slo)], num_requests=100)
    assert steady.short_run_warning() == "" and "caution" not in steady.summary()


def test_a_growing_queue_is_overload():
    slo = parse_slos("e2e_p95=1000")
    run = long_run()
    growing = TargetRun(run.requests, [(i * 0.1 + 0.05, i // 4) for i in range(100)])  # one more waiting every 0.4 s
    r = measure(growing, 10, slo)
    assert r.overloaded and r.violations == ["overload"] and r.waiting_end - r.waiting_start > 10
    small = TargetRun(run.requests, [(i * 0.1 + 0.05, min(i // 25, 3)) for i in range(100)])  # a few, not growing
    assert not measure(small, 10, slo).overloaded


def test_without_a_queue_the_ttft_trend_judges_overload():
    slo = parse_slos("e2e_p95=1000")
    growing = measure(long_run(waiting=False, ttft=lambda i: 0.01 + 0.01 * i), 10, slo)  # 0.01 s more per request
    assert growing.overloaded and growing.ttft_end > 2 * growing.ttft_start and growing.waiting_start is None
    flat = measure(long_run(waiting=False, ttft=lambda i: 0.05 + 0.02 * (i % 3)), 10, slo)
    assert not flat.overloaded
    tiny = measure(long_run(waiting=False, ttft=lambda i: 0.01 * 2**i, n=30, e2e=1e9), 10, slo)  # 24 measured
    assert not tiny.overloaded and tiny.ttft_start is None  # too few requests to tell a trend: no verdict
    assert "ttft" in growing.waiting_trend() and tiny.waiting_trend() == "-"


def test_a_stable_short_simulated_run_is_rarely_called_overloaded():
    from minillm.capacity import simulator_target
    from minillm.workloads import uniform

    target = simulator_target("continuous", "cpu-tiny", max_num_seqs=16)
    mix = [(1.0, uniform(8, 32), uniform(4, 128))]
    for rate in (20, 40):  # TTFT p95 ~10 ms, almost nothing waits: stable
        flagged = [
            measure(target(capacity_workload(mix, 24, rate, seed=seed)), rate, parse_slos("ttft_p95=1")).overloaded
            for seed in range(10)
        ]
        assert sum(flagged) <= 1, (rate, flagged)


@pytest.mark.parametrize(
    "num_requests, rate, overloaded", [(150, 21.5, False), (500, 150, False), (500, 800, True), (3000, 220, True)]
)
def test_the_h200_chunked_engine_is_overloaded_only_at_rates_it_cannot_serve(num_requests, rate, overloaded):
    from minillm.capacity import simulator_target

    target = simulator_target(
        "chunked", "h200-qwen3-0.6b", max_num_seqs=256, num_gpu_blocks=32768, max_num_batched_tokens=2048
    )
    r = measure(target(capacity_workload("mixed", num_requests, rate)), rate, parse_slos(SLOS))
    assert r.overloaded == overloaded
    if not overloaded:  # the in-system count grows (the batch fills with 1,024-token generations), the queue does not
        assert r.max_waiting <= 4 and r.waiting_end < 1


# --- the search -----------------------------------------------------------------------------------


def rate_of(workload, num_requests, seed=0):
    """The rate a workload was built at (its arrivals are the seed's unit arrivals / rate)."""
    return unit_arrivals(num_requests, seed)[-1] / workload.arrival_times[-1]


def step_target(capacity, num_requests=100):
    """A target whose TTFT jumps from 0.1 s to 2 s above ``capacity`` requests/s."""

    def run(workload):
        ttft = 0.1 if rate_of(workload, num_requests) <= capacity else 2.0
        return TargetRun([RequestResult(t, ttft, [0.01] * 3, ttft + 0.03) for t in workload.arrival_times])

    return run


@pytest.mark.parametrize("capacity", [0.7, 3.3, 17.0, 100.0, 300.0])
def test_the_search_finds_a_known_capacity_within_its_tolerance(capacity):
    result = find_capacity(
        "chunked",
        ["ttft_p95=0.5"],
        target=step_target(capacity),
        num_requests=100,
        mix="cpu chat",
        rate_range=(0.5, 512),
        rel_tol=0.05,
    )
    assert capacity / 1.05 <= result.max_rate <= capacity * (1 + 1e-9)
    assert all(r.met == (r.rate <= capacity * (1 + 1e-9)) for r in result.rates)
    assert [r.rate for r in result.rates] == sorted(r.rate for r in result.rates)
    assert len(result.rates) <= 16  # a search, not a grid


def test_the_search_reports_the_ends_of_the_range():
    assert (
        find_capacity("x", ["ttft_p95=0.5"], target=step_target(0.05), num_requests=100, mix="cpu chat").max_rate
        is None
    )
    top = find_capacity(
        "x", ["ttft_p95=0.5"], target=step_target(1e9), num_requests=100, mix="cpu chat", rate_range=(1, 40)
    )
    assert top.max_rate == 40 and "raise --rate-max" in top.summary()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    strict=st.floats(0.05, 0.95),
    extra=st.floats(0.0, 0.9),
    low=st.floats(0.1, 10),
    span=st.floats(1.5, 1000),
)
def test_loosening_an_slo_never_lowers_the_capacity_even_when_latency_is_not_monotone(seed, strict, extra, low, span):
    rng = np.random.default_rng(seed)
    bumps = rng.uniform(0, 1, size=64)

    def latency(rate):  # rises with the rate, with seeded bumps up and down
        return 0.5 * math.log10(rate) / 3 + 0.5 * bumps[int(abs(math.log(rate)) * 17) % 64]

    loose = strict + extra
    high = low * span
    capacity_strict = search_max_rate(lambda r: latency(r) <= strict, low, high)
    capacity_loose = search_max_rate(lambda r: latency(r) <= loose, low, high)
    assert (capacity_strict or 0) <= (capacity_loose or 0)


@pytest.mark.parametrize("ttft_targets", [(0.05, 0.2, 0.5, 2.0)])
def test_on_the_simulator_a_looser_slo_never_lowers_the_capacity(ttft_targets):
    capacities = [
        find_capacity(
            "continuous", [f"ttft_p95={t}", "itl_p95=0.05"], num_requests=100, seed=1, rate_range=(1, 256), rel_tol=0.1
        ).max_rate
        or 0
        for t in ttft_targets
    ]
    assert capacities == sorted(capacities) and capacities[-1] > capacities[0]


def test_the_same_seed_gives_the_same_answer():
    kwargs = dict(num_requests=100, rate_range=(1, 128), rel_tol=0.1, max_num_seqs=16)
    a, b = find_capacity("chunked", SLOS, seed=5, **kwargs), find_capacity("chunked", SLOS, seed=5, **kwargs)
    assert a.to_json() == b.to_json()
    assert base_workload("mixed", 100, seed=5).prompts != base_workload("mixed", 100, seed=6).prompts


def test_the_simulator_sweeps_500_requests_per_rate():
    result = find_capacity("chunked", SLOS, num_requests=500, rate_range=(4, 32), rel_tol=0.1)
    # the default 16 sequences: TTFT p95 crosses 0.5 s between 10.4 and 11.3 req/s, with no queue growing yet
    assert result.max_rate == pytest.approx(10.4, rel=0.05)
    assert result.first_failure.violations == ["ttft_p95"]
    for r in result.rates:
        assert r.num_measured == 400
        assert r.waiting_over_time and r.max_waiting >= 0
        assert r.output_tokens_per_s > 0 and 0 < r.goodput <= r.rate * 1.5
    met = [r for r in result.rates if r.met]
    assert all(r.ttft_p95 <= 0.5 and r.itl_p95 <= 0.05 and not r.overloaded for r in met)
    assert result.first_failure is not None and not result.first_failure.met
    data = json.loads(result.to_json())
    assert data["max_rate"] == result.max_rate and data["slo"] == {"ttft_p95": 0.5, "itl_p95": 0.05}


def test_the_real_engine_runs_a_handful_of_requests_at_two_rates(tiny, engine_on):
    llm = engine_on(tiny, "continuous", max_num_seqs=4)
    result = find_capacity(
        "continuous",
        ["ttft_p95=5", "itl_p95=1"],
        target=llm_target(llm),
        mix="cpu chat",
        num_requests=6,
        rate_range=(8, 16),
        rel_tol=1.5,
        seed=0,
    )
    assert [r.rate for r in result.rates] == [8, 16] and result.max_rate == 16
    for r in result.rates:
        assert 0 < r.ttft_p95 < 5 and 0 < r.itl_p95 < 1 and r.output_tokens_per_s > 0
        assert r.max_waiting is not None and r.waiting_over_time
    assert "real engine" in result.target


# --- the CLI --------------------------------------------------------------------------------------


def test_cli_prints_a_table_and_writes_json(tmp_path, capsys):
    path = tmp_path / "capacity.json"
    assert (
        main(
            [
                "capacity",
                "--engine",
                "chunked",
                "--slo",
                "ttft_p95=0.5",
                "--slo",
                "itl_p95=0.05",
                "--num-requests",
                "100",
                "--rate-min",
                "4",
                "--rate-max",
                "64",
                "--max-num-seqs",
                "16",
                "--max-num-batched-tokens",
                "1024",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "rate req/s" in out and "max rate meeting every SLO" in out
    data = json.loads(path.read_text())
    assert {"max_rate", "slo", "rates"} <= set(data)
    assert data["engine_options"] == {"max_num_seqs": 16, "max_num_batched_tokens": 1024}
    for entry in data["rates"]:
        assert {"rate", "met", "ttft_p95", "itl_p95", "output_tokens_per_s", "goodput"} <= set(entry)
    rates = [e["rate"] for e in data["rates"]]
    assert rates == sorted(rates)
    table_rates = [float(line.split()[0]) for line in out.splitlines() if line[:10].strip().replace(".", "").isdigit()]
    assert table_rates == pytest.approx(rates, rel=1e-2)


@pytest.mark.parametrize(
    "args",
    [
        ["--slo", "ttft_p95=-0.5"],
        ["--slo", "speed_p95=1"],
        [],
        ["--slo", "ttft_p95=0.5", "--rate-min", "8", "--rate-max", "2"],
        ["--slo", "ttft_p95=0.5", "--max-num-batched-tokens", "0"],
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, capsys):
    assert main(["capacity", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("minillm capacity: error:")


# --- the plot -------------------------------------------------------------------------------------


def small_result() -> CapacityResult:
    return find_capacity(
        "chunked",
        ["ttft_p95=0.5", "itl_p95=0.05"],
        target=step_target(10.0),
        num_requests=100,
        mix="cpu chat",
        rate_range=(1, 64),
    )


def test_draw_capacity_draws_slo_lines_the_max_rate_and_the_violating_load():
    from minillm.widgets import draw_capacity

    fig = draw_capacity(small_result())
    gids = {a.get_gid() for ax in fig.axes for a in ax.get_children()}
    assert {"slo-ttft_p95", "slo-itl_p95", "max-rate", "violating-rates", "points-output_tokens_per_s"} <= gids
    assert len(fig.axes) == 4 and fig.axes[1].get_xscale() == "log"
    result = small_result()
    goodput = next(c for c in fig.axes[1].collections if c.get_gid() == "points-goodput")
    met = [r for r in result.rates if r.met]
    assert [tuple(p) for p in goodput.get_offsets()] == [(r.rate, r.goodput) for r in met]
    assert "offered-load" in {a.get_gid() for a in fig.axes[1].get_children()}


def test_draw_capacities_has_a_bar_per_engine_and_colours_the_ties():
    from dataclasses import replace

    from minillm.widgets import draw_capacities
    from minillm.widgets.capacity import MET

    base = small_result()
    results = {
        "a": base,
        "b": replace(base, max_rate=base.max_rate * 1.02),
        "c": replace(base, max_rate=base.max_rate / 3),
    }
    fig = draw_capacities(results, rel_tol=0.05)
    ax = fig.axes[0]
    bars = {p.get_gid(): p for p in ax.patches}
    assert [bars[f"capacity-{n}"].get_width() for n in "abc"] == [results[n].max_rate for n in "abc"]
    blue = {n for n in "abc" if bars[f"capacity-{n}"].get_facecolor()[:3] == pytest.approx(to_rgb(MET))}
    assert blue == {"a", "b"}  # a within 5% of b: a tie; c a third of it
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0  # a third: compared by length, from 0
    results["d"] = replace(base, max_rate=base.max_rate / 100)
    assert draw_capacities(results, rel_tol=0.05).axes[0].get_xscale() == "log"  # a hundredth: orders of magnitude


def test_capacity_plot_is_a_figure_view_with_a_png_fallback():
    from minillm.widgets import capacity_plot

    view = capacity_plot(small_result())
    assert bytes(view.static_png()).startswith(b"\x89PNG")
    assert "image/png" in view._repr_mimebundle_()
    view.log_rate.value = False
    assert view.fig.axes[0].get_xscale() == "linear"
