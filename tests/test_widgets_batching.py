"""Chapter 1 and 2 pictures and the latency widget's labels, tested as state: draw from a small
hand-made run, then check what the figure holds (labels, ticks, artists), not its pixels."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from minillm.metrics import RequestMetrics, percentile_note, percentiles, summarize, time_per_output_token  # noqa: E402
from minillm.request import RequestOutput  # noqa: E402
from minillm.trace import StepRecord, Trace  # noqa: E402
from minillm.widgets import (  # noqa: E402
    draw_cost_breakdown,
    draw_forward_pass_costs,
    draw_head_of_line,
    draw_latency,
    draw_padding,
    draw_request_bars,
    draw_step_times,
    draw_token_times,
)
from minillm.widgets.latency import draw_histogram, format_time  # noqa: E402

MS = 1e-3


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def request(rid, arrival, start, token_times):
    m = RequestMetrics(
        arrival_time=arrival,
        first_scheduled_time=start,
        first_token_time=token_times[0],
        token_times=list(token_times),
        finished_time=token_times[-1],
        first_token_step=0,
        finished_step=len(token_times) - 1,
    )
    return RequestOutput(str(rid), [1, 2, 3], [7] * len(token_times), "", "length", m)


def many_requests(n):
    """``n`` requests served one after another: each waits, prefills 2 ms, then 3 tokens 1 ms apart."""
    outs, t = [], 0.0
    for i in range(n):
        outs.append(request(i, 0.0, t, [t + 2 * MS, t + 3 * MS, t + 4 * MS]))
        t += 4 * MS
    return outs


def static_trace():
    """Two batches of two: a prefill step each (with left pads), then decode steps in which a finished
    request's row idles."""
    trace = Trace()
    rows = [  # step, prefill ids, decode ids, useful tokens, padding rows
        (0, ["A", "B"], [], 10, 4),
        (1, [], ["A", "B"], 2, 0),
        (2, [], ["B"], 1, 1),
        (3, [], ["B"], 1, 1),
        (4, ["C", "D"], [], 6, 2),
        (5, [], ["C"], 1, 1),
    ]
    for step, pre, dec, useful, pad in rows:
        slots = {r: i for i, r in enumerate(["A", "B"] if step < 4 else ["C", "D"])}
        trace.record(
            StepRecord(
                step=step,
                start_time=step * 10 * MS,
                end_time=(step + 1) * 10 * MS,
                num_scheduled_tokens={r: (useful // len(pre) if pre else 1) for r in pre + dec},
                prefill_ids=pre,
                decode_ids=dec,
                admitted_ids=list(pre),
                finished_ids=[],
                num_running=2,
                num_waiting=0,
                slots=slots,
                num_input_tokens=useful + pad,
            )
        )
    return trace


# --- latency widget: readable numbers, thinned labels, titles clear of legends ----------------


def test_format_time_writes_plain_numbers_with_units():
    assert format_time(1410.2, "ms") == "1,410 ms"
    assert format_time(52198.0, "ms") == "52,198 ms"
    assert format_time(41.83, "ms") == "41.8 ms"
    assert format_time(3.517, "ms") == "3.52 ms"
    assert format_time(0.2141, "ms") == "0.214 ms"
    assert "e+" not in format_time(1.41e3, "ms")


def test_histogram_legend_says_p50_and_p95_with_their_unit():
    _, ax = plt.subplots()
    draw_histogram("TTFT", [1.2, 1.41, 1.6, 2.0], ax, what="4 requests")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    p = percentiles([1.2, 1.41, 1.6, 2.0], ps=(50, 95))
    assert labels == [f"p50 {format_time(p['p50'] * 1e3, 'ms')}", f"p95 {format_time(p['p95'] * 1e3, 'ms')}"]
    assert all("e+" not in label and label.endswith(" ms") for label in labels)
    assert ax.get_title(loc="left") == "TTFT (ms), 4 requests"


def test_latency_histograms_say_itl_pools_every_gap():
    outs = many_requests(3)
    fig = draw_latency(outs)
    titles = [ax.get_title(loc="left") for ax in fig.axes[1:]]
    assert titles == ["TTFT (ms), 3 requests", "ITL (ms), 6 gaps of 3 requests, pooled", "e2e (ms), 3 requests"]


def test_request_labels_thin_out_when_rows_do_not_fit():
    few, many = many_requests(3), many_requests(40)
    ax = draw_request_bars(few)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2"]
    _, small = plt.subplots(figsize=(6, 3))
    draw_request_bars(many, small)
    labels = [t.get_text() for t in small.get_yticklabels()]
    assert 2 <= len(labels) < 40 and labels[0] == "0"
    height_pt = small.get_window_extent().height / small.figure.dpi * 72
    assert len(labels) * 12 <= height_pt + 12  # each label has its 12 points
    assert "labelled" in small.get_ylabel()
    groups = [c for c in small.collections if (c.get_gid() or "").startswith("request-")]
    assert len(groups) == 40  # every request is still drawn


def test_request_bars_title_sits_above_the_legend():
    ax = draw_request_bars(many_requests(3), title="naive engine")
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title, legend = ax.title.get_window_extent(renderer), ax.get_legend().get_window_extent(renderer)
    assert ax.get_title() == "naive engine"
    assert title.y0 >= legend.y1 - 1  # no overlap
    assert draw_request_bars(many_requests(2), legend=False).get_legend() is None


# --- chapter 1 ---------------------------------------------------------------------------------


def test_forward_pass_costs_plot_time_and_time_per_token():
    ns, pre, dec = [8, 32, 128], [0.002, 0.004, 0.012], [0.001, 0.0011, 0.0015]
    fig = draw_forward_pass_costs(ns, pre, dec, where="a CPU", model="tiny")
    left, right = fig.axes
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.lines}
    assert np.allclose(lines["prefill"].get_ydata(), np.array(pre) * 1e3)
    assert np.allclose(lines["prefill-per-token"].get_ydata(), np.array(pre) / np.array(ns) * 1e3)
    assert np.allclose(lines["decode-per-token"].get_ydata(), np.array(dec) * 1e3)
    assert [t.get_text() for t in left.get_xticklabels()] == ["8", "32", "128"]
    assert not any(t.get_text() for t in left.get_xticklabels(minor=True))
    assert "measured" in fig._suptitle.get_text() and "a CPU" in fig._suptitle.get_text()


def test_token_times_plot_each_token_and_the_running_total():
    without, with_ = [0.002, 0.003, 0.004], [0.002, 0.001, 0.001]
    fig = draw_token_times(16, without, with_)
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.lines}
    assert list(lines["without-cache"].get_xdata()) == [16, 17, 18]
    assert np.allclose(lines["with-cache-total"].get_ydata(), np.cumsum(with_) * 1e3)


# --- chapter 2 ---------------------------------------------------------------------------------


def test_step_times_label_each_batch_size_once_per_panel():
    measured = {1: 0.002, 2: 0.0021, 4: 0.0025}
    simulated = {b: 0.003 + b * 2e-5 for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)}
    fig = draw_step_times(measured, simulated, weights_s=0.00028)
    left, right = fig.axes
    assert [t.get_text() for t in left.get_xticklabels()] == ["1", "2", "4"]
    assert [t.get_text() for t in right.get_xticklabels()] == [str(b) for b in simulated]
    for ax in fig.axes:
        assert not any(t.get_text() for t in ax.get_xticklabels(minor=True))
        assert all("10^" not in t.get_text() and "times" not in t.get_text() for t in ax.get_yticklabels())
    assert "cost model" in right.get_title() and "measured" in left.get_title()
    gids = {line.get_gid() for line in right.lines}
    assert {"simulated-step", "simulated-per-token", "weights-once"} <= gids
    assert len(draw_step_times(measured=measured).axes) == 1


def test_step_times_mark_each_panels_crossover_or_say_there_is_none():
    measured = {1: 0.002, 2: 0.0021, 4: 0.0025, 8: 0.003, 16: 0.004}
    simulated = {b: 0.003 + b * 2e-5 for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)}
    fig = draw_step_times(measured, simulated, crossover={"measured": 56, "simulated": None})
    left, right = fig.axes
    line = next(line for line in left.lines if line.get_gid() == "measured-crossover")
    assert list(line.get_xdata()) == [56, 56]
    assert left.get_xlim()[1] > 56  # the axis widened past the measured batches to show it, off the frame
    assert "B ≈ 56" in [t.get_text() for t in left.get_legend().get_texts()][-1]
    none = next(line for line in right.lines if line.get_gid() == "simulated-crossover")
    assert len(none.get_xdata()) == 0 and "memory-bound at every B" in none.get_label()
    assert "memory-bound at every B" in right.get_legend().get_texts()[-1].get_text()
    unmarked = draw_step_times(measured, simulated, crossover={"simulated": 128})
    gids = {line.get_gid() for ax in unmarked.axes for line in ax.lines}
    assert "simulated-crossover" in gids and "measured-crossover" not in gids
    assert not any("crossover" in str(line.get_gid()) for ax in draw_step_times(measured).axes for line in ax.lines)


def test_cost_breakdown_stacks_parts_and_hatches_the_assumed_ones():
    parts = {"weight reads": {1: 0.3e-3, 2: 0.3e-3}, "host overhead per pass": {1: 3e-3, 2: 3e-3}}
    fig = draw_cost_breakdown(parts, assumed=("host overhead per pass",))
    ax = fig.axes[0]
    bars = {p.get_gid(): p for p in ax.patches}
    assert bars["host overhead per pass-1"].get_hatch() == "//" and not bars["weight reads-2"].get_hatch()
    assert bars["host overhead per pass-1"].get_y() == pytest.approx(0.3)  # stacked on the weight reads
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["weight reads (from measured ceilings)", "host overhead per pass (ASSUMED)"]


def test_padding_shows_prefill_pads_and_idle_decode_rows():
    fig = draw_padding(static_trace(), title="padding")
    left, right = fig.axes

    def by_gid(ax, gid):
        return [p for p in ax.patches if p.get_gid() == gid]

    assert [p.get_height() for p in by_gid(left, "left-pad")] == [4, 2]
    assert [p.get_height() for p in by_gid(right, "idle")] == [0, 1, 1, 1]
    assert [t.get_text() for t in left.get_xticklabels()] == ["0", "1"]
    fig.canvas.draw()
    assert all(float(v).is_integer() for v in right.get_yticks())  # whole rows, no 0.5 ticks


def test_head_of_line_title_is_clear_of_the_legend():
    trace, outs = Trace(), many_requests(2)
    trace.record(
        StepRecord(
            step=0,
            start_time=0,
            end_time=MS,
            num_scheduled_tokens={"0": 3},
            prefill_ids=["0"],
            decode_ids=[],
            finished_ids=[],
            num_running=1,
            num_waiting=1,
            slots={"0": 0},
        )
    )
    trace.record(
        StepRecord(
            step=1,
            start_time=MS,
            end_time=2 * MS,
            num_scheduled_tokens={"0": 1},
            prefill_ids=[],
            decode_ids=["0"],
            finished_ids=["0"],
            num_running=1,
            num_waiting=1,
            slots={"0": 0},
        )
    )
    ax = draw_head_of_line(trace, outs, title="two slots", names={"0": "A", "1": "B"})
    assert ax.get_title() == "two slots"
    assert "A" in [t.get_text() for t in ax.texts], "the cells name the requests as the text does"
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    assert ax.title.get_window_extent(renderer).y0 >= ax.get_legend().get_window_extent(renderer).y1 - 1


# --- metrics: percentiles over few values, per-request ITL -------------------------------------


def test_percentile_note_says_where_a_percentile_falls():
    assert percentile_note(95, 4) == "over 4 values, p95 lies 85% of the way from the 3rd-smallest value to the largest"
    assert percentile_note(50, 3) == "over 3 values, p50 is the 2nd-smallest value"
    assert percentile_note(95, 1) == "with a single value, p95 is that value"
    assert "11th-smallest" in percentile_note(95, 12)


def test_tpot_counts_each_request_once():
    short = request(0, 0.0, 0.0, [0.01, 0.02])  # one gap of 10 ms
    long = request(1, 0.0, 0.0, [0.01 + 0.001 * i for i in range(11)])  # ten gaps of 1 ms
    assert time_per_output_token([short, long]) == pytest.approx([0.01, 0.001])
    s = summarize([short, long])
    assert s["request_time_per_output_token_seconds"]["p50"] == pytest.approx(0.0055)
    assert s["inter_token_latency_seconds"]["p50"] == pytest.approx(0.001)  # pooled: the long request's gaps win


def test_longest_gap_is_the_largest_gap_of_any_request():
    from minillm.metrics import longest_gap

    short = request(0, 0.0, 0.0, [0.01, 0.05])  # one gap of 40 ms
    long = request(1, 0.0, 0.0, [0.01, 0.02, 0.09, 0.10])  # gaps of 10, 70, 10 ms
    assert longest_gap([short, long]) == pytest.approx(0.07)
    assert longest_gap([request(2, 0.0, 0.0, [0.01])]) == 0.0  # one token: no gap


def test_left_padding_draws_pads_left_and_every_prompt_ending_in_the_last_column():
    from minillm.engines.static import left_pad
    from minillm.widgets import draw_left_padding

    fig = draw_left_padding(*left_pad([[11, 12, 13], [21, 22, 23, 24, 25], [31]], 0))
    gids = {p.get_gid() for p in fig.axes[0].patches}
    assert {"pad-0-0", "pad-0-1", "token-0-2", "token-1-0", "pad-2-3", "token-2-4"} <= gids
    assert "pad-1-0" not in gids and "6 pad(s) of 15 cells" in fig.axes[0].get_title()
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "31\npos 0" in texts and "25\npos 4" in texts  # positions count from each row's first real token


def test_latency_cdfs_draw_one_line_per_run_and_metric():
    from minillm import workloads
    from minillm.sim import simulate
    from minillm.widgets import draw_latency_cdfs

    w = workloads.mix_workload("uniform", 20, rate=5.0, seed=0)
    runs = {"light": simulate("continuous", w, max_num_seqs=8).outputs}
    runs["heavy"] = simulate(
        "continuous", workloads.mix_workload("uniform", 20, rate=500.0, seed=0), max_num_seqs=8
    ).outputs
    fig = draw_latency_cdfs(runs)
    ttft, itl = fig.axes
    light = next(ln for ln in ttft.lines if ln.get_gid() == "cdf-ttft-light")
    assert sorted(light.get_xdata()) == pytest.approx(sorted(o.metrics.ttft * 1e3 for o in runs["light"]))
    assert light.get_ydata()[-1] == 1.0
    assert {ln.get_gid() for ln in itl.lines} >= {"cdf-itl-light", "cdf-itl-heavy"}
    heavy = next(ln for ln in ttft.lines if ln.get_gid() == "cdf-ttft-heavy")
    assert np.median(heavy.get_xdata()) > np.median(light.get_xdata())  # a heavier load waits longer
