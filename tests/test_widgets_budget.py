"""``draw_budget_sweep``: chapter 6's TTFT / ITL trade-off picture."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from minillm.widgets import draw_budget_sweep  # noqa: E402


def test_the_budget_sweep_draws_each_budget_and_the_unbudgeted_run():
    rows = [
        {"budget": b, "ttft_p95": t, "itl_p95": i, "itl_max": m}
        for b, t, i, m in ((16, 0.9, 0.005, 0.007), (256, 0.25, 0.03, 0.035), (None, 0.3, 0.02, 0.13))
    ]
    fig = draw_budget_sweep(rows, title="t")
    left, right = fig.axes[0], fig.axes[1]
    assert [t.get_text() for t in left.get_xticklabels()] == ["16", "256", "no budget"]
    assert left.lines[0].get_xdata().tolist() == [16, 256, 1024]  # no budget: four times the largest
    assert [a.get_text() for a in right.texts] == ["16", "256", "no budget"]
    # The trade-off plots the longest gap, the stall a budget protects against, against TTFT.
    assert right.lines[0].get_xdata().tolist() == [7.0, 35.0, 130.0]
    assert right.lines[0].get_ydata().tolist() == [900.0, 250.0, 300.0]


def test_the_stall_picture_marks_each_runs_longest_gap():
    from minillm import workloads
    from minillm.sim import simulate
    from minillm.widgets import draw_stall

    # Two chat requests decoding; a long prompt arrives while they do.
    w = workloads.fixed([16, 16, 3000], [60, 60, 4], [0.0, 0.0, 0.05], seed=0)
    runs = {
        "no budget": simulate("paged", w, max_num_seqs=4).outputs,
        "budget 256": simulate("chunked", w, max_num_seqs=4, max_num_batched_tokens=256).outputs,
    }
    fig = draw_stall(runs, ["0", "1"], arrivals=[0.05], title="t")
    gaps = {}
    for ax, (label, outputs) in zip(fig.axes, runs.items()):
        ticks = [c for c in ax.collections if c.get_gid() == f"tokens-{label}-0"]
        assert len(ticks) == 1 and len(ticks[0].get_positions()) == len(outputs[0].metrics.token_times)
        shaded = next(p for p in ax.patches if p.get_gid() == f"longest-gap-{label}")
        longest = max(max(o.metrics.itl) for o in outputs[:2])
        assert shaded.get_width() == pytest.approx(longest * 1e3)
        gaps[label] = shaded.get_width()
    assert gaps["budget 256"] < gaps["no budget"]  # the budget shortens the stall


def test_the_saturated_budget_picture_draws_throughput_and_stacked_steps():
    from minillm.widgets import draw_budget_throughput

    rows = [
        {"budget": 128, "tps": 3000.0, "decode_steps": 400, "chunk_steps": 4500},
        {"budget": 1024, "tps": 7600.0, "decode_steps": 1100, "chunk_steps": 650},
        {"budget": None, "tps": 7400.0, "decode_steps": 1400, "chunk_steps": 300},
    ]
    fig = draw_budget_throughput(rows, title="t")
    left, right = fig.axes
    tps = next(ln for ln in left.lines if ln.get_gid() == "tps")
    assert list(tps.get_xdata()) == [128, 1024] and list(tps.get_ydata()) == [3000.0, 7600.0]
    assert list(next(ln for ln in left.lines if ln.get_gid() == "no-budget").get_ydata()) == [7400.0, 7400.0]
    bars = {p.get_gid(): p for p in right.patches}
    assert bars["decode-128"].get_height() == 400 and bars["chunk-128"].get_y() == 400
    assert bars["chunk-no budget"].get_height() == 300
    assert [t.get_text() for t in right.get_xticklabels()] == ["128", "1024", "no budget"]


def test_chunks_reread_the_keys_of_every_earlier_chunk():
    from minillm.widgets.budget import chunk_rereads

    assert chunk_rereads(512, 512) == 0  # one chunk: nothing earlier to read
    assert chunk_rereads(512, 128) == 128 * (0 + 1 + 2 + 3)
    assert chunk_rereads(500, 128) == 128 * (0 + 1 + 2 + 3)  # the last, partial chunk still reads 384 earlier tokens


def test_the_chunk_cost_picture_draws_the_measured_ttfts_and_the_rereads():
    from minillm.widgets import draw_chunk_costs

    fig = draw_chunk_costs(512, [64, 512], [0.03, 0.01])
    left, right = fig.axes
    (line,) = [line for line in left.lines if line.get_gid() == "ttft"]
    assert line.get_ydata().tolist() == [30.0, 10.0]  # ms
    assert [t.get_text() for t in left.texts] == ["8 steps", "1 step"]
    assert [bar.get_height() for bar in right.patches] == [64 * 28, 0]
