"""Chapter 9's pictures: ``draw_attainable`` (the roofline itself, with measured steps on it),
``draw_roofline`` (a decode step's roofline on two devices) and ``draw_throughputs`` (every
system's output tok/s from a ``minillm bench`` report)."""

import matplotlib

matplotlib.use("Agg")

from minillm.widgets import draw_attainable, draw_roofline, draw_throughputs  # noqa: E402
from minillm.widgets.palette import COLORS, DECODE, IDLE  # noqa: E402


def test_the_attainable_roofline_bends_at_each_ridge_and_places_each_step_under_the_first_roof():
    devices = {
        "this CPU": {"peak_flops": 100.0, "memory_bandwidth": 10.0},
        "H200": {"peak_flops": 1e4, "memory_bandwidth": 100.0},
    }
    steps = [
        {"label": "decode", "intensity": 0.5, "flops_per_s": 1.0},
        {"label": "prefill", "intensity": 40.0, "flops_per_s": 50.0},
    ]
    fig = draw_attainable(devices, steps)
    ax = fig.axes[0]
    roofs = [line for line in ax.lines if "the roof" in line.get_label()]
    assert [r.get_label() for r in roofs] == [
        "this CPU: the roof (ridge 10 FLOP/byte)",
        "H200: the roof (ridge 100 FLOP/byte)",
    ]
    x, y = roofs[0].get_data()
    assert y.max() == 100.0 and abs(y[0] - 10.0 * x[0]) < 1e-9  # flat at the peak, bandwidth x intensity below
    points = [line for line in ax.lines if "measured" in line.get_label()]
    assert [p.get_label() for p in points] == ["decode: measured (5x below)", "prefill: measured (2x below)"]
    assert [(p.get_xdata()[0], p.get_ydata()[0]) for p in points] == [(0.5, 1.0), (40.0, 50.0)]


def test_the_roofline_draws_each_devices_ridge_and_floor_and_the_measured_steps():
    batches = [1, 2, 4]
    devices = {
        "this CPU": {"ridge": 10.0, "intensity": [0.5, 1.0, 2.0], "floor_s": [1e-3, 1.1e-3, 1.2e-3]},
        "H200": {"ridge": 188.0, "intensity": [1.0, 2.0, 4.0], "floor_s": [1e-5, 1.1e-5, 1.2e-5]},
    }
    fig = draw_roofline(batches, devices, measured={1: 4e-3, 4: 8e-3}, title="t")
    left, right = fig.axes
    assert left.lines[0].get_ydata().tolist() == [0.5, 1.0, 2.0]  # the first device's intensity
    ridges = [line.get_ydata()[0] for line in left.lines[1:]]
    assert ridges == [10.0, 188.0]
    labels = [line.get_label() for line in right.lines]
    # a step against a step's floor only: the time per token is a note, not a line below the floor
    assert labels == ["this CPU: the floor", "H200: the floor", "measured here: one step"]
    assert right.lines[0].get_ydata().tolist() == [1.0, 1.1, 1.2]  # in ms
    assert right.lines[2].get_ydata().tolist() == [4.0, 8.0]
    assert [t.get_text().strip() for t in right.texts] == ["2.00 ms per token"]  # the largest batch: step / size
    assert fig.get_size_inches()[0] <= 9  # stacked: shown at its size, legends legible


def test_the_throughputs_chart_has_a_bar_per_system_and_the_floor_in_its_title():
    report = {
        "systems": [
            {"system": "transformers generate (static batches)", "output_tok_s": 100.0},
            {"system": "transformers continuous batching", "output_tok_s": 80.0},
            {"system": "minillm naive", "output_tok_s": 25.0},
            {"system": "minillm chunked", "output_tok_s": 150.0},
        ],
        "floor": {"floor_output_tok_s": 1234.0, "bound": "memory"},
        "workload": {"requests": 32, "output_tokens": 2584},
    }
    fig = draw_throughputs(report)
    ax = fig.axes[0]
    widths = [bar.get_width() for bar in ax.patches]
    assert widths == [150.0, 25.0, 80.0, 100.0]  # the report's order, top to bottom
    assert [matplotlib.colors.to_hex(bar.get_facecolor()) for bar in ax.patches] == [
        COLORS[DECODE],
        COLORS[DECODE],
        COLORS[IDLE],
        COLORS[IDLE],
    ]
    assert "1.50x the best baseline" in ax.texts[0].get_text()
    assert "1,234 tok/s (memory-bound, 8x the fastest bar: off this axis)" in ax.get_title()
    assert all(ax.get_xlim()[1] > t.get_position()[0] for t in ax.texts)  # every label starts inside the frame
    report["floor"]["floor_output_tok_s"] = 200.0  # within reach: drawn as a line
    ax = draw_throughputs(report).axes[0]
    assert [line.get_xdata()[0] for line in ax.lines if line.get_gid() == "floor"] == [200.0]


def test_the_decode_bandwidth_picture_draws_a_line_per_context_and_counts_the_programs():
    from minillm.widgets import draw_decode_bandwidth

    rows = [{"batch": b, "context": c, "gb_s": g} for b, c, g in [(1, 512, 20.0), (16, 512, 300.0), (1, 8192, 60.0)]]
    ax = draw_decode_bandwidth(rows, copy_gb_s=4000.0, num_kv_heads=8).axes[0]
    lines = {line.get_gid(): line for line in ax.lines if line.get_gid()}
    assert lines["context-512"].get_ydata().tolist() == [20.0, 300.0]
    assert lines["context-8192"].get_xdata().tolist() == [1]
    assert sorted(t.get_text() for t in ax.texts) == ["128 programs", "8 programs"]
