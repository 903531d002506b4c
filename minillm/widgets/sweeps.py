"""Pictures of many runs at once: how the waiting queue grows at several loads, and how engines
compare as the arrival rate grows (chapter 3's simulator sections).

    from minillm.widgets import draw_queue_over_time, draw_engine_sweep
    draw_queue_over_time({"0.5x": run_a.trace, "3x": run_b.trace})
    draw_engine_sweep(rates, {"static": [summary, ...], "continuous": [...]})

Both read only traces and ``minillm.metrics.summarize`` dictionaries, so they show real and
simulated runs alike; the caller says which in ``title``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt


def draw_queue_over_time(
    traces: dict,
    ax=None,
    title: str = "",
    time_label: str = "seconds",
    windows: dict | None = None,
    last_arrivals: dict | None = None,
):
    """One line per run: requests waiting in the queue after every engine step, against the time
    the step ended. ``traces``: ``{legend label: trace}``. ``windows``: ``{label: (start, end)}``, the
    stretch of a run whose requests are measured, shaded in its line's colour (gid
    ``window-<label>``); ``last_arrivals``: ``{label: seconds}``, a dotted line where arrivals end
    (gid ``last-arrival-<label>``): after it the engine only drains. Returns the Axes; each line's
    ``gid`` is ``queue-<label>``."""
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.2))
    for label, trace in traces.items():
        (line,) = ax.step(
            [r.end_time for r in trace], [r.num_waiting for r in trace], where="post", label=label, gid=f"queue-{label}"
        )
        if windows and label in windows:
            start, end = windows[label]
            ax.axvspan(start, end, color=line.get_color(), alpha=0.12, lw=0, gid=f"window-{label}")
        if last_arrivals and label in last_arrivals:
            ax.axvline(last_arrivals[label], color=line.get_color(), ls=":", lw=1, gid=f"last-arrival-{label}")
    ax.set(xlabel=time_label, ylabel="requests waiting", title=title)
    ax.title.set_fontsize(10)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return ax


SWEEP_PANELS = {
    "throughput": ("output_throughput_tokens_per_second", None, "output tokens/s", "linear"),
    "TTFT p95": ("time_to_first_token_seconds", "p95", "seconds", "log"),
}


def sweep_values(summaries, key: str, stat: str | None) -> list[float]:
    """One number per summary: ``summary[key]``, or ``summary[key][stat]`` (``"p95"``, ...)."""
    return [s[key] if stat is None else s[key][stat] for s in summaries]


def draw_engine_sweep(rates, summaries: dict, title: str = "", panels=("throughput", "TTFT p95")):
    """Each engine's summary at every arrival rate: output throughput (left) and TTFT p95 (right),
    on a log rate axis. ``summaries``: ``{engine: [summary at rates[0], summary at rates[1], ...]}``.
    Returns the Figure; each line's ``gid`` is ``<panel>-<engine>``."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        key, stat, unit, yscale = SWEEP_PANELS[panel]
        for engine, runs in summaries.items():
            if len(runs) != len(rates):
                raise ValueError(f"{engine}: {len(runs)} summaries for {len(rates)} rates")
            ax.plot(rates, sweep_values(runs, key, stat), "o-", label=engine, gid=f"{panel}-{engine}")
        ax.set(xscale="log", yscale=yscale, xlabel="arrival rate (requests/s)", ylabel=unit, title=panel)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
