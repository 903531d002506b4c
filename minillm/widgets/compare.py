"""Two or more runs of the same requests, side by side (chapters 2, 3 and 4).

    from minillm.widgets import compare_request_bars, compare_step_times
    compare_request_bars({"static": static_outputs, "continuous": continuous_outputs})
    compare_step_times({"continuous": c_durations, "selective": s_durations}, mixed_steps)

``compare_request_bars`` draws the latency timeline's bars (queue, prefill, decode per request) for
every run on one shared time axis. ``compare_step_times`` compares engines that ran the same plan,
step by step: every step's duration, and the chosen steps (say, the ones that mix a prefill with
decodes) as bars side by side.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FixedLocator

from minillm.widgets.latency import draw_request_bars
from minillm.widgets.naive import plain_log_y


def compare_request_bars(runs: dict, title: str = "", max_height: float = 9.0, max_width: float = 16.0):
    """``runs``: ``{name: outputs}``, the same requests in every run (or the same arrivals served
    different ways). One panel per run, shared time and request axes, one legend for all above
    them. Returns the Figure (at most ``max_height`` inches tall, however many requests, and
    ``max_width`` wide, however many runs)."""
    n = max((len(outputs) for outputs in runs.values()), default=1)
    height = min(max_height, 1.6 + 0.25 * n)
    width = min(max_width, 6 * len(runs))
    fig, axes = plt.subplots(1, len(runs), figsize=(width, height), sharex=True, sharey=True, squeeze=False)
    handles = []
    for i, (ax, (name, outputs)) in enumerate(zip(axes[0], runs.items())):
        draw_request_bars(outputs, ax)
        legend = ax.get_legend()
        if legend is not None:
            handles = handles or legend.legend_handles
            legend.remove()
        ax.set_title(name, fontsize=10)
        if i:
            ax.set_ylabel("")
    # Above the panels, in inches from the top: the title, then the legend.
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.08 / height, va="top")
    if handles:
        fig.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, 1 - 0.3 / height),
            ncol=len(handles),
            frameon=False,
            fontsize=8,
        )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / height))
    return fig


def tick_positions(n: int, max_ticks: int = 10) -> list[int]:
    """At most ``max_ticks`` evenly spaced indices out of ``range(n)``, always the first and last."""
    if n <= max_ticks:
        return list(range(n))
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, max_ticks)})


def compare_step_times(
    durations: dict, chosen_steps, title: str = "", chosen_label: str = "the chosen steps", max_ticks: int = 10
):
    """``durations``: ``{engine: [seconds of step 0, step 1, ...]}`` for runs of the same plan.
    Left, every step's duration (log scale); right, the ``chosen_steps`` as bars side by side, with
    at most ``max_ticks`` step numbers under them so the labels never overlap. Returns the Figure;
    the right panel's bars carry ``gid`` ``<engine>-step-<n>``."""
    chosen_steps = list(chosen_steps)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": (1.6, 1)})
    width = 0.8 / max(len(durations), 1)
    x = np.arange(len(chosen_steps))
    for i, (engine, seconds) in enumerate(durations.items()):
        ms = np.asarray(seconds, dtype=float) * 1e3
        ax1.plot(np.arange(len(ms)), ms, ".", ms=4, label=engine)
        offset = (i - (len(durations) - 1) / 2) * width
        bars = ax2.bar(x + offset, ms[chosen_steps] if chosen_steps else [], width=width, label=engine)
        for bar, step in zip(bars, chosen_steps):
            bar.set_gid(f"{engine}-step-{step}")
    ticks = tick_positions(len(chosen_steps), max_ticks)
    ax2.xaxis.set_major_locator(FixedLocator(ticks))
    ax2.set_xticklabels([str(chosen_steps[t]) for t in ticks], fontsize=8)
    ax2.set_xlim(-0.6, max(len(chosen_steps), 1) - 0.4)
    ax1.set(xlabel="engine step", ylabel="ms", yscale="log", title="every step's duration")
    plain_log_y(ax1)
    ax2.set(
        xlabel=f"engine step ({len(chosen_steps)} steps; some numbers left out)"
        if len(ticks) < len(chosen_steps)
        else "engine step",
        ylabel="ms",
        title=chosen_label,
    )
    for ax in (ax1, ax2):
        ax.title.set_fontsize(10)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
