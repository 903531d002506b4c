"""Chapter 2's pictures: step time against batch size (with the batch at which the roofline predicts
a step turns compute-bound), where a simulated step's time comes from, padding waste and
head-of-line blocking (dynamic batching's runs side by side: ``compare_request_bars``).

    from minillm.widgets import draw_step_times, draw_cost_breakdown, draw_padding
    draw_step_times(measured={1: 0.0014, 4: 0.0017}, simulated={1: 0.0033, 256: 0.0119},
                    crossover={"measured": 56, "simulated": None})

Each returns its matplotlib Figure (``draw_head_of_line`` its Axes, like ``draw_slots``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from minillm.widgets import palette
from minillm.widgets.naive import label_log_axis, plain_log_y
from minillm.widgets.slots import draw_slots

MS = 1e3
MEASURED_STYLE = dict(color=palette.COLORS[palette.DECODE])
SIMULATED_STYLE = dict(color="#009e73")  # bluish green: simulated figures never share the measured colour


def draw_step_times(
    measured=None,
    simulated=None,
    *,
    measured_label: str = "measured on this machine",
    simulated_label: str = "simulated H200 (cost model)",
    weights_s: float | None = None,
    measured_title: str | None = None,
    simulated_title: str | None = None,
    crossover: dict | None = None,
) -> plt.Figure:
    """One decode step's time and its time per token against the batch size B: ``measured`` and
    ``simulated`` map B to seconds (either may be omitted; each gets its own panel, since the two
    are different models on different hardware). ``weights_s`` draws the time to read the weights
    once on the simulated panel. Batch sizes are ticks at exactly the B values (log scale, no minor
    labels). Lines carry ``gid`` ``<which>-step`` and ``<which>-per-token``.

    ``crossover`` maps a panel (``"measured"``, ``"simulated"``) to the batch size at which the
    roofline predicts its step turns compute-bound, so that the prediction sits on the measurement:
    a dashed vertical line there (the axis widens past it), or for ``None`` a legend entry saying
    the step stays memory-bound at every batch size. Either carries ``gid`` ``<which>-crossover``."""
    panels = [
        (name, data, label, title, style)
        for name, data, label, title, style in (
            ("measured", measured, measured_label, measured_title, MEASURED_STYLE),
            ("simulated", simulated, simulated_label, simulated_title, SIMULATED_STYLE),
        )
        if data
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4), squeeze=False)
    for ax, (name, data, label, title, style) in zip(axes[0], panels):
        bs = np.array(sorted(data), dtype=float)
        step = np.array([data[int(b)] for b in bs]) * MS
        ax.plot(bs, step, "o-", gid=f"{name}-step", label="one decode step", **style)
        ax.plot(bs, step / bs, "s--", gid=f"{name}-per-token", label="per token (step / B)", alpha=0.8, **style)
        if name == "simulated" and weights_s is not None:
            ax.axhline(weights_s * MS, color="0.4", lw=1, ls=":", gid="weights-once", label="reading the weights once")
        ax.set(xscale="log", yscale="log", xlabel="batch size B (sequences decoding together)", ylabel="ms")
        if crossover and name in crossover:
            mark_crossover(ax, crossover[name], gid=f"{name}-crossover")
        label_log_axis(ax, bs)
        plain_log_y(ax)
        ax.set_title(title or label, fontsize=10)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)  # off the curves
        ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def mark_crossover(ax, batch: int | None, *, gid: str) -> None:
    """The predicted crossover batch on a step-time panel: a dashed line at ``batch``, or, when no
    batch size gets there, only a legend entry that says so (there is no place on the axis to mark)."""
    if batch is None:
        ax.plot([], [], " ", gid=gid, label="no crossover: memory-bound at every B")
    else:
        ax.axvline(batch, color="0.2", lw=1, ls="--", gid=gid, label=f"predicted crossover, B ≈ {batch}")
        ax.set_xlim(right=max(ax.get_xlim()[1], batch * 1.3))  # not on the frame, when it lies past the last batch


def draw_cost_breakdown(parts: dict, assumed=(), *, title: str = "") -> plt.Figure:
    """Stacked bars, one per batch size: what a simulated step's time is made of. ``parts`` maps a
    component's name to ``{B: seconds}``; the names in ``assumed`` are drawn hatched (inputs the
    profile assumes rather than measures). Bars are ``gid`` ``<name>``-``<B>``."""
    names = list(parts)
    bs = sorted(next(iter(parts.values()))) if parts else []
    colors = ["#56b4e9", "#009e73", "#e69f00", "#f0e442", "#cc79a7", "#999999"]
    fig, ax = plt.subplots(figsize=(10, 4))
    x = np.arange(len(bs))
    bottom = np.zeros(len(bs))
    for i, name in enumerate(names):
        ys = np.array([parts[name][b] for b in bs]) * MS
        hatched = name in assumed
        bars = ax.bar(
            x,
            ys,
            bottom=bottom,
            width=0.7,
            color=colors[i % len(colors)],
            edgecolor="#444444",
            linewidth=0.5,
            hatch="//" if hatched else None,
            label=f"{name} (ASSUMED)" if hatched else f"{name} (from measured ceilings)",
        )
        for bar, b in zip(bars, bs):
            bar.set_gid(f"{name}-{b}")
        bottom += ys
    ax.set_xticks(x, [str(b) for b in bs])
    ax.set(xlabel="batch size B", ylabel="ms per decode step")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", framealpha=0.9)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def draw_padding(trace, *, title: str = "") -> plt.Figure:
    """Where a static-batching run's token rows went. Left: each batch's prefill step, prompt
    tokens and left pads. Right: every decode step, useful rows and idle rows (finished requests
    that still hold their slot). Bars carry ``gid`` ``prompt``, ``left-pad``, ``useful``, ``idle``."""
    prefill = [r for r in trace if r.admitted_ids]
    decode = [r for r in trace if not r.admitted_ids]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": (1, 2.5)})
    labels = [str(i) for i in range(len(prefill))]
    real = [r.num_batched_tokens for r in prefill]
    ax1.bar(labels, real, color=palette.COLORS[palette.PREFILL], label="prompt tokens", gid="prompt")
    ax1.bar(
        labels,
        [r.num_padding_tokens for r in prefill],
        bottom=real,
        color=palette.COLORS[palette.IDLE],
        label="left padding",
        gid="left-pad",
    )
    ax1.set(title="the prefill step of each batch", xlabel="batch", ylabel="token rows computed")
    x = [r.step for r in decode]
    useful = [r.num_batched_tokens for r in decode]
    ax2.bar(x, useful, width=1.0, color=palette.COLORS[palette.DECODE], label="useful decode row", gid="useful")
    ax2.bar(
        x,
        [r.num_padding_tokens for r in decode],
        width=1.0,
        bottom=useful,
        color=palette.COLORS[palette.IDLE],
        label="idle row (its request has finished)",
        gid="idle",
    )
    ax2.set(title="every decode step", xlabel="engine step", ylabel="token rows computed")
    for ax in (ax1, ax2):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_head_of_line(trace, outputs, *, title: str = "", names: dict | None = None):
    """The slots timeline of a head-of-line example, with the title above the legend (not on it).
    ``names`` maps request ids to the names the text uses (``{"0": "A"}``); the cells show those
    names. Returns the Axes."""
    ax = draw_slots(trace, outputs, labels=names)
    if title:
        ax.set_title(title, fontsize=10, pad=26)
    ax.figure.tight_layout()
    return ax


def draw_left_padding(input_ids, positions, mask, *, title: str = "") -> plt.Figure:
    """A left-padded ``[B, T]`` batch as a grid: real tokens (blue, their id and position) right-
    aligned, pads (grey) on the left, so every row's last token sits in the last column. Cells
    carry gid ``token-<row>-<col>`` or ``pad-<row>-<col>``. Returns the Figure."""
    ids, pos, real = (np.asarray(t) for t in (input_ids, positions, mask))
    rows, cols = ids.shape
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * cols, 0.6 + 0.55 * rows))
    for r in range(rows):
        for c in range(cols):
            kind = "token" if real[r, c] else "pad"
            color = palette.COLORS[palette.DECODE] if real[r, c] else palette.COLORS[palette.IDLE]
            ax.add_patch(plt.Rectangle((c, r), 0.95, 0.9, color=color, gid=f"{kind}-{r}-{c}"))
            text = f"{ids[r, c]}\npos {pos[r, c]}" if real[r, c] else "pad"
            ax.text(
                c + 0.475,
                r + 0.45,
                text,
                ha="center",
                va="center",
                fontsize=7,
                color="white" if real[r, c] else "black",
            )
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_xticks([c + 0.475 for c in range(cols)], [str(c) for c in range(cols)], fontsize=7)
    ax.set_yticks([r + 0.45 for r in range(rows)], [f"row {r}" for r in range(rows)], fontsize=8)
    ax.set_xlabel("column of the [B, T] batch")
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    pads = int((~real.astype(bool)).sum())
    ax.set_title(title or f"{pads} pad(s) of {real.size} cells: every prompt ends in the last column", fontsize=9)
    fig.tight_layout()
    return fig
