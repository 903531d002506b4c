"""The drawings of chapters 3 and 4 (slots with names, runs side by side, token packing, queue growth,
engine sweeps), tested as state on small simulated runs: what each returned figure holds."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from minillm import workloads  # noqa: E402
from minillm.sim import simulate  # noqa: E402
from minillm.widgets import (  # noqa: E402
    compare_request_bars,
    compare_slots,
    compare_step_times,
    draw_engine_sweep,
    draw_packing,
    draw_queue_over_time,
    draw_slots,
    packing_layouts,
)
from minillm.widgets.compare import tick_positions  # noqa: E402
from minillm.widgets.slots import SlotsTimeline, cell_grid, prefill_spans, step_info  # noqa: E402

NAMES = {"0": "A", "1": "B", "2": "C"}
MIX = "support chat: short answers + long summaries"


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def two_slot():
    w = workloads.two_slot_example()
    return {e: simulate(e, w, max_num_seqs=2) for e in ("static", "continuous")}


@pytest.fixture(scope="module")
def mixed_run():
    """A continuous run in which several steps mix a new prompt with decodes."""
    return simulate("continuous", workloads.mix_workload(MIX, 12, seed=0), max_num_seqs=4)


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


# --- slots with names ---------------------------------------------------------------------------


def test_labels_name_the_requests_in_cells_rows_and_step_text(two_slot):
    r = two_slot["static"]
    grid = cell_grid(r.trace, r.outputs, labels=NAMES)
    assert {c for row in grid.labels for c in row} == {"", "A", "B", "C"}
    by_request = cell_grid(r.trace, r.outputs, rows="requests", labels=NAMES)
    assert by_request.row_names == ["A", "B", "C"]
    ax = draw_slots(r.trace, r.outputs, labels=NAMES)
    assert {"A", "B", "C"} <= set(texts(ax)) and not {"0", "1", "2"} & set(texts(ax))
    assert "decode   A, B" in step_info(r.trace[1], labels=NAMES)
    partial = cell_grid(r.trace, r.outputs, labels={"2": "C"})  # unnamed ids stay as they are
    assert {c for row in partial.labels for c in row} == {"", "0", "1", "C"}


def test_slots_timeline_describes_steps_with_the_names(two_slot):
    r = two_slot["continuous"]
    w = SlotsTimeline(r.trace, r.outputs, labels=NAMES)
    w.slider.value = 2
    assert "prefill  C (1 token)" in w.info.value and "admitted C" in w.info.value


def test_step_text_says_which_part_of_a_prompt_a_chunk_covers():
    # budget 5: the 17-token prompt of B runs in chunks beside A's decodes
    w = workloads.fixed(prompt_lens=[3, 17], output_lens=[6, 2])
    r = simulate("chunked", w, max_num_batched_tokens=5, max_num_seqs=2, block_size=4)
    spans = prefill_spans(r.trace, r.outputs)
    assert [s.get("1") for s in spans[:5]] == [(1, 2, 17), (3, 6, 17), (7, 10, 17), (11, 14, 17), (15, 17, 17)]
    assert spans[0]["0"] == (1, 3, 3) and spans[5] == {}
    timeline = SlotsTimeline(r.trace, r.outputs, labels={"0": "A", "1": "B"})
    timeline.slider.value = 3
    assert "prefill  B (tokens 11–14 of 17)" in timeline.info.value and "decode   A" in timeline.info.value
    timeline.slider.value = 0
    assert "prefill  A (3 tokens), B (tokens 1–2 of 17)" in timeline.info.value
    assert "5 tokens in the batch" in timeline.info.value
    text = step_info(r.trace[3])  # without spans: the chunk's size only
    assert "prefill  1 (4 tokens)" in text


def test_step_text_counts_one_token_in_the_singular():
    w = workloads.fixed(prompt_lens=[1, 6], output_lens=[2, 1])
    r = simulate("chunked", w, max_num_batched_tokens=1, max_num_seqs=2, block_size=4)
    texts_ = [step_info(rec, spans=s) for rec, s in zip(r.trace, prefill_spans(r.trace, r.outputs))]
    assert "prefill  0 (1 token)" in texts_[0] and "1 token in the batch" in texts_[0]
    assert not any("1 tokens" in t for t in texts_)
    assert any("prefill  1 (token 6 of 6)" in t for t in texts_)


def test_compare_slots_puts_runs_on_one_step_axis(two_slot):
    fig = compare_slots({name: (r.trace, r.outputs) for name, r in two_slot.items()}, labels=NAMES)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["static: 6 steps", "continuous: 4 steps"]
    assert axes[0].get_xlim() == axes[1].get_xlim() == (-0.5, 5.5)
    assert "C" in texts(axes[1])


# --- runs side by side --------------------------------------------------------------------------


def test_compare_request_bars_shares_axes_and_shows_the_legend_once(two_slot):
    fig = compare_request_bars({name: r.outputs for name, r in two_slot.items()}, title="two slots")
    left, right = fig.axes
    assert left.get_title() == "static" and right.get_title() == "continuous"
    assert left.get_legend() is None and right.get_legend() is None and len(fig.legends) == 1  # one legend for both
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["waiting in queue", "prefill", "decode"]
    assert left.get_xlim() == right.get_xlim()
    gids = {c.get_gid() for c in right.collections}
    assert {"request-0", "request-1", "request-2"} <= gids
    assert fig._suptitle.get_text() == "two slots"


def test_tick_positions_thin_out_long_axes():
    assert tick_positions(5) == [0, 1, 2, 3, 4]
    ticks = tick_positions(42)
    assert len(ticks) <= 10 and ticks[0] == 0 and ticks[-1] == 41 and ticks == sorted(set(ticks))


def test_compare_step_times_labels_at_most_ten_of_many_steps():
    n = 100
    durations = {"continuous": np.linspace(1, 2, n) * 1e-3, "selective": np.linspace(1, 2, n) * 0.9e-3}
    chosen = list(range(3, 87, 2))  # 42 steps
    fig = compare_step_times(durations, chosen, chosen_label="mixed steps")
    every, bars = fig.axes
    assert len(every.lines) == 2
    assert len(bars.patches) == 2 * len(chosen)
    assert {p.get_gid() for p in bars.patches} >= {"continuous-step-3", "selective-step-85"}
    labels = [t.get_text() for t in bars.get_xticklabels()]
    assert 2 <= len(labels) <= 10 and labels[0] == "3" and labels[-1] == "85"
    heights = {p.get_gid(): p.get_height() for p in bars.patches}
    assert heights["selective-step-3"] == pytest.approx(durations["selective"][3] * 1e3)


# --- token packing ------------------------------------------------------------------------------


def test_packing_layouts_of_a_mixed_step(mixed_run):
    record = next(r for r in mixed_run.trace if r.prefill_ids and len(r.decode_ids) >= 2)
    lay = packing_layouts(record)
    assert lay.ids == list(record.num_scheduled_tokens)
    assert lay.cu_seqlens[0] == 0 and lay.num_tokens == record.num_batched_tokens
    assert np.diff(lay.cu_seqlens).tolist() == lay.lengths
    assert len(lay.passes) == len(record.prefill_ids) + 1  # a pass per prompt, one for the decodes
    assert sorted(lay.passes[-1]) == sorted(record.decode_ids)
    assert lay.padded_rows == len(lay.ids) * max(lay.lengths)


def test_draw_packing_draws_every_request_in_every_layout(mixed_run):
    record = next(r for r in mixed_run.trace if r.prefill_ids and r.decode_ids)
    fig = draw_packing(record)
    passes, padded, flat = fig.axes
    for layout, ax in (("passes", passes), ("padded", padded), ("flat", flat)):
        gids = {p.get_gid() for p in ax.patches}
        assert {f"{layout}-{rid}" for rid in record.num_scheduled_tokens} <= gids
    lay = packing_layouts(record)
    assert flat.get_title() == f"selective batching: one flat pass of {lay.num_tokens} tokens"
    assert passes.get_title() == f"chapter 3's engine: {len(lay.passes)} forward passes"
    assert set(flat.get_xticks()) <= set(lay.cu_seqlens) and {0, lay.num_tokens} <= set(flat.get_xticks())


# --- many runs ----------------------------------------------------------------------------------


def test_queue_over_time_draws_each_run_s_waiting_queue():
    w = workloads.mix_workload(MIX, 30, rate=400.0, seed=0)
    runs = {f"{n} slots": simulate("continuous", w, max_num_seqs=n).trace for n in (2, 8)}
    ax = draw_queue_over_time(runs, title="queue")
    lines = {line.get_gid(): line for line in ax.lines}
    assert set(lines) == {"queue-2 slots", "queue-8 slots"}
    assert list(lines["queue-2 slots"].get_ydata()) == runs["2 slots"].column("num_waiting")
    assert max(lines["queue-2 slots"].get_ydata()) > max(lines["queue-8 slots"].get_ydata())


def test_queue_over_time_shades_the_measured_window_and_marks_the_last_arrival():
    w = workloads.mix_workload(MIX, 30, rate=400.0, seed=0)
    runs = {"2 slots": simulate("continuous", w, max_num_seqs=2).trace}
    ax = draw_queue_over_time(runs, windows={"2 slots": (0.01, 0.05)}, last_arrivals={"2 slots": 0.07})
    window = next(p for p in ax.patches if p.get_gid() == "window-2 slots")
    assert window.get_x() == 0.01 and abs(window.get_x() + window.get_width() - 0.05) < 1e-12
    line = next(ln for ln in ax.lines if ln.get_gid() == "last-arrival-2 slots")
    assert list(line.get_xdata()) == [0.07, 0.07]
    assert line.get_color() == next(ln for ln in ax.lines if ln.get_gid() == "queue-2 slots").get_color()


def test_engine_sweep_has_a_line_per_engine_in_each_panel():
    rates = [20.0, 200.0, 2000.0]
    summaries = {
        e: [simulate(e, workloads.mix_workload(MIX, 24, rate=r, seed=0), max_num_seqs=4).summary for r in rates]
        for e in ("static", "continuous")
    }
    fig = draw_engine_sweep(rates, summaries, title="sweep")
    throughput, ttft = fig.axes
    assert throughput.get_xscale() == "log" and ttft.get_yscale() == "log"
    line = next(ln for ln in throughput.lines if ln.get_gid() == "throughput-continuous")
    assert list(line.get_ydata()) == [s["output_throughput_tokens_per_second"] for s in summaries["continuous"]]
    line = next(ln for ln in ttft.lines if ln.get_gid() == "TTFT p95-static")
    assert list(line.get_ydata()) == [s["time_to_first_token_seconds"]["p95"] for s in summaries["static"]]
    with pytest.raises(ValueError, match="2 summaries for 3 rates"):
        draw_engine_sweep(rates, {"static": summaries["static"][:2]})


# --- what a p95 over a few requests is ----------------------------------------------------------


def test_summary_html_says_where_p95_falls_among_few_requests():
    from minillm.widgets.controls import simulated_run, summary_html

    outputs, trace = simulated_run(num_requests=8)("continuous", 4, 20.0, MIX)
    assert "over 8 values, p95 lies 65% of the way from the 7th-smallest value to the largest" in summary_html(
        outputs, trace
    )


def test_the_ragged_mask_is_causal_within_a_request_and_blind_across():
    from minillm.widgets import draw_ragged_mask, ragged_mask

    # A: a 3-token prompt (nothing cached); B: one decode token after 4 cached ones.
    mask = ragged_mask([3, 1], [3, 5])
    expected = np.zeros((4, 8), dtype=bool)
    expected[0, 0:1] = expected[1, 0:2] = expected[2, 0:3] = True  # A: causal over its own prompt
    expected[3, 3:8] = True  # B's decode sees its 4 cached keys and itself, none of A's
    assert (mask == expected).all()
    fig = draw_ragged_mask([3, 1], [3, 5], ids=["A", "B"])
    image = next(im for im in fig.axes[0].images if im.get_gid() == "mask")
    assert (image.get_array() == expected).all()
    assert "11 of 32" in fig.axes[0].get_title()  # 1 + 2 + 3 for A, 5 for B


def test_the_seqs_sweep_draws_throughput_latency_and_the_memory_limit():
    from minillm.widgets import draw_seqs_sweep

    rows = [
        {"max_num_seqs": n, "tps": t, "itl_p95": i, "ttft_p95": 1.0}
        for n, t, i in ((1, 300, 0.003), (16, 2200, 0.010), (64, 2250, 0.010))
    ]
    fig = draw_seqs_sweep(rows, memory_limit=25)
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines()}
    assert list(lines["tps"].get_xdata()) == [1, 16, 64]
    assert list(lines["itl"].get_ydata()) == pytest.approx([3.0, 10.0, 10.0])
    assert list(lines["trade-off"].get_xdata()) == pytest.approx([3.0, 10.0, 10.0])
    assert list(lines["memory-limit"].get_xdata()) == [25, 25]


def test_the_variance_sweep_draws_each_engine_and_its_ratio_to_the_baseline():
    from minillm.widgets import draw_variance_sweep

    fig = draw_variance_sweep([0.0, 1.0, 2.0], {"static": [4000, 1300, 700], "continuous": [3700, 3100, 2100]})
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines()}
    assert list(lines["tps-static"].get_ydata()) == [4000, 1300, 700]
    assert list(lines["ratio-continuous"].get_ydata()) == pytest.approx([0.925, 3100 / 1300, 3.0])
    assert "ratio-static" not in lines and list(lines["parity"].get_ydata()) == [1.0, 1.0]
    assert [t.get_text() for t in fig.axes[1].texts] == ["0.9×", "2.4×", "3.0×"]
    with pytest.raises(ValueError, match="baseline"):
        draw_variance_sweep([0.0], {"continuous": [1.0]})
    with pytest.raises(ValueError, match="2 throughputs for 3"):
        draw_variance_sweep([0.0, 1.0, 2.0], {"static": [1.0, 2.0]})
