"""Pictures of many runs at once: how the waiting queue grows at several loads, and how engines
compare as the arrival rate, the number of slots or the spread of output lengths grows (chapter 3's
simulator sections).

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


def draw_seqs_sweep(rows: list[dict], memory_limit: int | None = None, title: str = ""):
    """Throughput against latency as ``max_num_seqs`` grows: ``rows`` hold ``max_num_seqs``, ``tps``
    (output tokens/s), ``itl_p95`` and ``ttft_p95`` (seconds). Left: throughput and ITL p95 against
    ``max_num_seqs``, with ``memory_limit`` (the most requests the KV memory held at once) marked:
    past it, more slots change nothing. Right: throughput against ITL p95, each point labelled with
    its ``max_num_seqs``. Lines carry gids ``tps``, ``itl``, ``trade-off``; the mark ``memory-limit``.
    Returns the Figure."""
    seqs = [r["max_num_seqs"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    left.plot(seqs, [r["tps"] for r in rows], "o-", color="#0072b2", gid="tps", label="output tok/s")
    left.set(xscale="log", xlabel="max_num_seqs", ylabel="output tokens/s")
    left.set_xticks(seqs, [str(n) for n in seqs])
    left.minorticks_off()
    left.set_ylim(bottom=0)
    itl_axis = left.twinx()
    itl_axis.plot(seqs, [r["itl_p95"] * 1e3 for r in rows], "s--", color="#d55e00", gid="itl", label="ITL p95")
    itl_axis.set(ylabel="ITL p95 (ms)")
    itl_axis.set_ylim(bottom=0)
    if memory_limit is not None:
        left.axvline(memory_limit, color="#555555", ls=":", gid="memory-limit")
        left.annotate(
            f"KV memory: {memory_limit} at once",
            (memory_limit, 0.05),
            xycoords=("data", "axes fraction"),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=8,
            color="#555555",
        )
    left.legend(handles=left.get_lines()[:1] + itl_axis.get_lines(), fontsize=8, loc="center right", frameon=False)
    right.plot([r["itl_p95"] * 1e3 for r in rows], [r["tps"] for r in rows], "o-", color="#555555", gid="trade-off")
    for r in rows:
        right.annotate(
            str(r["max_num_seqs"]),
            (r["itl_p95"] * 1e3, r["tps"]),
            xytext=(4, -10),
            textcoords="offset points",
            fontsize=8,
        )
    right.set(xlabel="ITL p95 (ms)", ylabel="output tokens/s", title="each point one max_num_seqs")
    right.title.set_fontsize(9)
    right.set_xlim(left=0)
    right.set_ylim(bottom=0)
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_variance_sweep(cvs: list[float], tps: dict[str, list[float]], baseline: str = "static", title: str = ""):
    """Engines' output tokens/s as the spread of output lengths grows (``cvs``: each run's coefficient
    of variation; ``tps``: ``{engine: [tok/s at cvs[0], ...]}``). Left: each engine's throughput;
    right: each other engine's throughput divided by ``baseline``'s, with parity marked. A static
    batch holds its slots until its longest request ends, so its line should fall as the spread
    grows. Lines carry gids ``tps-<engine>``, ``ratio-<engine>`` and ``parity``. Returns the Figure."""
    if baseline not in tps:
        raise ValueError(f"baseline {baseline!r} is not one of the engines {sorted(tps)}")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    for engine, values in tps.items():
        if len(values) != len(cvs):
            raise ValueError(f"{engine}: {len(values)} throughputs for {len(cvs)} coefficients of variation")
        (line,) = left.plot(cvs, values, "o-", label=engine, gid=f"tps-{engine}")
        if engine != baseline:
            ratio = [v / b for v, b in zip(values, tps[baseline])]
            right.plot(cvs, ratio, "o-", color=line.get_color(), label=f"{engine} / {baseline}", gid=f"ratio-{engine}")
            for x, y in zip(cvs, ratio):
                right.annotate(f"{y:.1f}×", (x, y), xytext=(0, 6), textcoords="offset points", ha="center", fontsize=8)
    right.axhline(1.0, color="#555555", ls=":", gid="parity")
    left.set(xlabel="spread of output lengths (std / mean)", ylabel="output tokens/s", title="throughput")
    right.set(xlabel="spread of output lengths (std / mean)", ylabel="throughput ratio", title=f"against {baseline}")
    left.set_ylim(bottom=0)
    right.set_ylim(bottom=0, top=max(1.2, right.get_ylim()[1] * 1.1))
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
