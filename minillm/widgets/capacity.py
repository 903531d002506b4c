"""The capacity plot (chapter 8): what an engine delivered, and how fast it felt, as the offered load
rose, with the SLOs and the largest rate that met them.

    from minillm.capacity import find_capacity
    from minillm.widgets import capacity_plot, draw_capacity
    result = find_capacity("chunked", ["ttft_p95=0.5", "itl_p95=0.05"])
    capacity_plot(result)        # a widget (log / linear rate axis), a PNG where widgets cannot run
    draw_capacity(result)        # the same picture as a plain matplotlib Figure

One panel of throughput (output tokens/s; it grows with the load until the engine saturates, then
flattens), one of goodput (requests/s that met every SLO of their own, beside the offered load: it
follows the load, then falls away from it past capacity), then one per SLO: that latency percentile
at every rate tried, its target as a dashed line, the latencies above it shaded. Rates that failed
(an SLO, or overload) are crosses, and the load beyond the first failure above the capacity is
shaded in every panel; a vertical line marks the capacity. Reads only a ``CapacityResult``, so it
shows the simulator and a real engine alike.
"""

from __future__ import annotations

import math

import ipywidgets as widgets
from matplotlib.figure import Figure

from minillm.widgets.figure_view import FigureView
from minillm.widgets.palette import P95

MET = "#0072b2"  # blue: the rate met every SLO
BROKE = "#d55e00"  # vermillion: it broke one (or overloaded)
SHADE = "#d55e00"
LOG_SPAN = 10  # the largest capacity over the smallest beyond which draw_capacities draws a log axis


def capacity_panels(result) -> list[tuple[str, str, float | None]]:
    """``(key, y label, SLO target or None)`` per panel: throughput, goodput, then one per SLO."""
    panels = [
        ("output_tokens_per_s", "output tokens/s", None),
        ("goodput", "goodput (req/s that met their SLOs)", None),
    ]
    panels += [(s.name, f"{s.name.replace('_', ' ')} (ms), SLO {s.target * 1e3:g}", s.target * 1e3) for s in result.slo]
    return panels


def _values(result, key: str) -> list[float]:
    if key == "output_tokens_per_s":
        return [r.output_tokens_per_s for r in result.rates]
    if key == "goodput":
        return [r.goodput for r in result.rates]
    return [r.latencies[key] * 1e3 for r in result.rates]


def grid_shape(num_panels: int) -> tuple[int, int]:
    """Two panels a row: four side by side would shrink to unreadable type in a notebook's width."""
    cols = min(2, num_panels)
    return -(-num_panels // cols), cols


def figure_size(num_panels: int) -> tuple[float, float]:
    rows, cols = grid_shape(num_panels)
    return 5.0 * cols + 1.5, 3.3 * rows + 0.4


def draw_capacity(result, fig: Figure | None = None, log_rate: bool = True, title: str | None = None) -> Figure:
    """Draw ``result`` (a ``minillm.capacity.CapacityResult``) into ``fig`` (a new Figure when
    None). Returns the Figure; artists carry ``gid``\\s: ``points-<key>``, ``slo-<name>``,
    ``max-rate``, ``violating-rates``."""
    panels = capacity_panels(result)
    if fig is None:
        fig = Figure(figsize=figure_size(len(panels)))
    fig.clear()
    rows, cols = grid_shape(len(panels))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for spare in axes[len(panels) :]:
        spare.remove()
    rates = [r.rate for r in result.rates]
    met = [r.met for r in result.rates]
    fail = result.first_failure
    for ax, (key, label, target) in zip(axes, panels):
        ys = _values(result, key)
        ax.plot(rates, ys, "-", color="#999999", lw=1, zorder=1)
        ax.scatter(
            [x for x, ok in zip(rates, met) if ok],
            [y for y, ok in zip(ys, met) if ok],
            color=MET,
            marker="o",
            s=22,
            zorder=3,
            label="met every SLO",
            gid=f"points-{key}",
        )
        ax.scatter(
            [x for x, ok in zip(rates, met) if not ok],
            [y for y, ok in zip(ys, met) if not ok],
            color=BROKE,
            marker="x",
            s=30,
            zorder=3,
            label="broke an SLO / overloaded",
            gid=f"points-{key}-broke",
        )
        if key == "goodput":  # every request good: goodput equals the offered load
            ax.plot(rates, rates, ls=":", color="#555555", lw=1, label="offered load", gid="offered-load")
        if target is not None:
            ax.axhline(target, color=P95, ls="--", lw=1.2, label="SLO target", gid=f"slo-{key}")
            top = max([target, *(y for y in ys if not math.isnan(y))]) * 2  # NaN: no ITL at all
            ax.axhspan(target, top, color=SHADE, alpha=0.08, lw=0)  # latencies here break the SLO
            ax.set_ylim(min([target, *(y for y in ys if y > 0)]) / 2, top)
            ax.set_yscale("log")
        if fail is not None:
            ax.axvspan(fail.rate, max(rates) * 1.5, color=SHADE, alpha=0.10, lw=0, gid="violating-rates")
        if result.max_rate is not None:
            ax.axvline(
                result.max_rate, color="black", lw=1.2, gid="max-rate", label=f"max rate {result.max_rate:.3g} req/s"
            )
        ax.set_xscale("log" if log_rate else "linear")
        ax.set_xlim(*((min(rates) / 1.3, max(rates) * 1.3) if log_rate else (0, max(rates) * 1.05)))
        ax.set_xlabel("offered load (requests/s)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.25)
    axes[cols - 1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    if title is None:
        capacity = "no rate met" if result.max_rate is None else f"capacity {result.max_rate:.3g} req/s"
        title = f"{result.engine} on {result.target}, mix {result.mix!r}: {capacity}"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


class CapacityPlot(FigureView):
    """``draw_capacity`` with a choice of rate axis (log shows the search's doublings evenly;
    linear shows how close the failures sit to the capacity)."""

    def __init__(self, result):
        self.result = result
        self.log_rate = widgets.Checkbox(value=True, description="log rate axis", indent=False)
        super().__init__(Figure(figsize=figure_size(len(capacity_panels(result)))), [self.log_rate])
        self.log_rate.observe(lambda change: self.redraw(), names="value")
        self.redraw()

    def redraw(self) -> None:
        draw_capacity(self.result, self.fig, log_rate=self.log_rate.value)
        self.refresh()


def capacity_plot(result) -> CapacityPlot:
    """The capacity plot as a widget, with a static PNG fallback."""
    return CapacityPlot(result)


def draw_capacities(results: dict, rel_tol: float | None = None, title: str = "") -> Figure:
    """One bar per engine (``results``: ``{name: CapacityResult}``, the same SLOs and workload), each
    labelled with its capacity and what broke just above it; on a log axis where they span more than
    ``LOG_SPAN`` (continuous batching against static: orders of magnitude), else a linear one from 0,
    on which two capacities compare by their lengths. Bars within the search's tolerance (``rel_tol``,
    by default the results') of the best are drawn as one colour: a tie. Bars carry gid
    ``capacity-<name>``. Returns the Figure."""
    names = list(results)
    caps = [results[n].max_rate or 0.0 for n in names]
    tol = rel_tol if rel_tol is not None else max((r.rel_tol for r in results.values()), default=0.0)
    best = max(caps, default=0.0)
    fig = Figure(figsize=(9, 0.5 * len(names) + 1.3))
    ax = fig.subplots()
    for y, (name, cap) in enumerate(zip(names, caps)):
        tie = best > 0 and cap >= best / (1 + tol)
        ax.barh(y, cap, color=MET if tie else "#999999", gid=f"capacity-{name}")
        fail = results[name].first_failure
        broke = ", ".join(fail.violations) if fail else "nothing in the range"
        ax.text(cap, y, f" {cap:.3g} req/s (then {broke})", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    positive = [c for c in caps if c > 0]
    if positive and best / min(positive) > LOG_SPAN:
        ax.set_xscale("log")
        ax.set_xlim(min(positive) / 2, best * 20)
    elif positive:
        ax.set_xlim(0, best * 1.8)  # room for the labels right of the longest bar
    ax.set_xlabel("capacity: the largest arrival rate that met every SLO (requests/s)")
    ax.set_title(title or f"blue: within the search's {tol:.0%} tolerance of the best, a tie", fontsize=9)
    fig.tight_layout()
    return fig
