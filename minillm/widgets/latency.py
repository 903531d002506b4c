"""Latency timeline: where each request's time went, and what that does to the distributions.

Left, one bar per request on the wall clock: queue (arrival -> first scheduled), prefill (first
scheduled -> first token), decode (first token -> finished) with a tick per generated token, so
uneven gaps between ticks are inter-token latency you can see. Right, the TTFT, ITL and e2e
histograms over all requests, with p50 and p95 marked: the numbers a serving SLO is written in.

    from minillm.widgets import latency_timeline
    latency_timeline(outputs)
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from minillm.metrics import percentiles
from minillm.widgets import palette
from minillm.widgets.figure_view import FigureView

ROW_LABEL_PT = 12  # vertical room (points) one request label needs; with less, only every k-th row is labelled


def time_unit(seconds) -> tuple[float, str]:
    """Milliseconds, like ``metrics.summary_table``, unless the values run past 10 s."""
    return (1.0, "s") if max(seconds, default=0.0) > 10 else (1e3, "ms")


def format_time(value: float, unit: str = "") -> str:
    """A time already in ``unit``, written for a reader: ``52,198 ms``, ``41.8 ms``, ``3.52 ms``,
    ``0.214 ms`` (never ``1.41e+03``)."""
    a = abs(value)
    if a != a:  # NaN
        text = "n/a"
    elif a >= 100:
        text = f"{value:,.0f}"
    elif a >= 10:
        text = f"{value:.1f}"
    elif a >= 1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3f}"
    return f"{text} {unit}".strip()


def row_label_step(num_rows: int, max_labels: int) -> int:
    """Label every k-th of ``num_rows`` rows so that at most ``max_labels`` labels are drawn."""
    return max(1, -(-num_rows // max(1, max_labels)))


def _labels_that_fit(ax) -> int:
    """How many row labels the Axes' height holds without overlapping."""
    height_pt = ax.get_window_extent().height / ax.figure.dpi * 72  # works inside subfigures too
    return max(2, int(height_pt // ROW_LABEL_PT))


def draw_latency(outputs, fig=None, max_requests: int = 40) -> Figure:
    """The latency timeline as a static Figure. Bars show the first ``max_requests`` requests (in
    arrival order); the histograms always use all of them. The ITL histogram pools every gap of
    every request (its title says how many), so long answers weigh more than short ones."""
    if fig is None:
        fig = plt.figure(figsize=(12, max(5.0, 1.5 + 0.22 * min(len(outputs), max_requests))))
    grid = fig.add_gridspec(3, 2, width_ratios=(2.2, 1), hspace=0.9, wspace=0.25)
    timeline = fig.add_subplot(grid[:, 0])
    shown = sorted(outputs, key=lambda o: o.metrics.arrival_time)[:max_requests]
    draw_request_bars(shown, timeline)
    if len(shown) < len(outputs):
        timeline.set_title(f"first {len(shown)} of {len(outputs)} requests", fontsize=9)
    ms = [o.metrics for o in outputs]
    n = len(ms)
    gaps = [gap for m in ms for gap in m.itl]
    for row, (name, values, what) in enumerate(
        [
            ("TTFT", [m.ttft for m in ms], f"{n} requests"),
            ("ITL", gaps, f"{len(gaps)} gaps of {n} requests, pooled"),
            ("e2e", [m.e2e for m in ms], f"{n} requests"),
        ]
    ):
        draw_histogram(name, values, fig.add_subplot(grid[row, 1]), what=what)
    return fig


def draw_request_bars(
    outputs, ax=None, *, title: str | None = None, legend: bool = True, max_labels: int | None = None
):
    """One group of bars per request (``gid`` = ``request-<id>``), first request on top: queue,
    prefill, decode, with a dark tick per generated token after the first. Returns the Axes.

    Without ``ax``, a figure sized for the number of requests. With more requests than labels fit
    in the Axes' height (or than ``max_labels``), only every k-th row is labelled. The legend sits
    above the axes; ``title`` goes above the legend (a plain ``ax.set_title`` would be drawn on top of it)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(11, min(12.0, 1.6 + 0.3 * len(outputs))))
    scale, unit = time_unit([o.metrics.finished_time for o in outputs])
    ticks, tick_rows = [], []
    for row, o in enumerate(outputs):
        m = o.metrics
        phases = [
            (m.arrival_time, m.first_scheduled_time, palette.WAITING),
            (m.first_scheduled_time, m.first_token_time, palette.PREFILL),
            (m.first_token_time, m.finished_time, palette.DECODE),
        ]
        ax.broken_barh(
            [(a * scale, (b - a) * scale) for a, b, _ in phases],
            (row - 0.4, 0.8),
            facecolors=[palette.COLORS[state] for _, _, state in phases],
            gid=f"request-{o.request_id}",
        )
        ticks += [t * scale for t in m.token_times[1:]]  # the first token ends the prefill bar
        tick_rows += [row] * (len(m.token_times) - 1)
    # Dark, translucent ticks: where tokens come densely they darken the bar instead of hollowing it out.
    ax.vlines(
        ticks, [r - 0.25 for r in tick_rows], [r + 0.25 for r in tick_rows], colors="black", alpha=0.35, linewidth=0.5
    )
    every = row_label_step(len(outputs), max_labels or _labels_that_fit(ax))
    rows = range(0, len(outputs), every)
    ax.set_yticks(list(rows), [outputs[r].request_id for r in rows])
    ax.set_ylim(len(outputs) - 0.5, -0.5)
    ax.set_xlabel(f"time since start ({unit})")
    ax.set_ylabel("request" if every == 1 else f"request (1 in {every} labelled)")
    if legend:
        ax.legend(
            handles=palette.legend_handles((palette.WAITING, palette.PREFILL, palette.DECODE)),
            loc="lower left",
            bbox_to_anchor=(0, 1.01),
            ncol=3,
            frameon=False,
            fontsize=8,
        )
    if title:
        ax.set_title(title, fontsize=9, pad=26 if legend else 6)
    return ax


def draw_histogram(name: str, values, ax, what: str | None = None):
    """A histogram with vertical lines at p50 and p95 (``gid`` ``p50`` / ``p95``), labelled with
    their values and unit. ``what`` says in the title what was counted (e.g. ``"12 requests"``);
    by default, the number of values."""
    scale, unit = time_unit(values)
    values = [v * scale for v in values]
    ax.set_title(f"{name} ({unit}), {what or f'{len(values)} values'}", fontsize=9, loc="left")
    if not values:
        ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
        return ax
    lo, hi = min(values), max(values)
    pad = 0.05 * max(abs(hi), 1e-9)
    if hi - lo < pad:  # (nearly) all equal: one bar in a readable window, not 20 slivers of rounding noise
        lo, hi = lo - pad, hi + pad
    counts, _, _ = ax.hist(values, bins=20, range=(lo, hi), color="#999999")
    # Headroom above the tallest bar for the legend: it never covers a bar.
    ax.set_ylim(0, max(counts.max(), 1) * 1.5)
    p = percentiles(values, ps=(50, 95))
    for key, color, style in (("p50", palette.P50, "--"), ("p95", palette.P95, ":")):
        ax.axvline(
            p[key], color=color, linestyle=style, linewidth=1.8, gid=key, label=f"{key} {format_time(p[key], unit)}"
        )
    ax.legend(fontsize=7, loc="upper right", framealpha=0.9, edgecolor="none")
    ax.tick_params(labelsize=8)
    return ax


class LatencyTimeline(FigureView):
    """``draw_latency`` as a widget, so the controls can redraw it after every run."""

    def __init__(self, outputs, max_requests: int = 40):
        self.max_requests = max_requests
        super().__init__(Figure(figsize=(12, 5)))
        self.set_data(outputs)

    def set_data(self, outputs) -> None:
        self.outputs = outputs
        self.fig.clear()
        draw_latency(outputs, self.fig, self.max_requests)
        self.refresh()


def latency_timeline(outputs, max_requests: int = 40) -> LatencyTimeline:
    return LatencyTimeline(outputs, max_requests)


def draw_latency_cdfs(runs: dict, title: str = "") -> Figure:
    """Cumulative distributions of TTFT (one value per request) and ITL (every gap, pooled), one line
    per run (``{label: outputs}``), on a log time axis so that runs far apart share a picture; a dot
    marks each line's p95. Lines carry gid ``cdf-<metric>-<label>``. Returns the Figure."""
    fig = plt.figure(figsize=(11, 3.6))
    axes = fig.subplots(1, 2)
    for ax, (metric, name) in zip(axes, (("ttft", "TTFT, one value per request"), ("itl", "ITL, every gap pooled"))):
        for label, outputs in runs.items():
            values = (
                [o.metrics.ttft for o in outputs] if metric == "ttft" else [g for o in outputs for g in o.metrics.itl]
            )
            if not values:
                continue
            xs = np.sort(np.asarray(values)) * 1e3
            ys = np.arange(1, len(xs) + 1) / len(xs)
            (line,) = ax.step(xs, ys, where="post", label=label, gid=f"cdf-{metric}-{label}")
            p95 = percentiles(values, ps=(95,))["p95"] * 1e3
            ax.plot([p95], [0.95], "o", color=line.get_color(), markersize=4)
        ax.axhline(0.95, color="#999999", lw=0.8, ls=":")
        ax.set(xscale="log", xlabel=f"{name} (ms)", ylabel="share of values at or below", ylim=(0, 1.02))
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
