"""Chapter 6's trade-off: what the token budget ``max_num_batched_tokens`` does to TTFT and ITL.

    from minillm.widgets import draw_budget_sweep
    draw_budget_sweep([{"budget": 64, "ttft_p95": 0.4, "itl_p95": 0.011, "itl_max": 0.012}, ...])

``draw_stall`` shows the stall itself: each decoding request's token times, one run above the other,
with the longest gap of each run marked. ``draw_budget_throughput`` shows the other half of the
trade-off, at saturation: tokens/s and the engine's steps per budget. ``draw_chunk_costs`` shows what a
chunk costs one prompt: a step per chunk, and its earlier chunks' keys and values read again.

Left: the latencies against the budget (log scale). Right: the same runs as a trade-off curve,
TTFT against the longest gap between two tokens (the stall a budget protects against; the 95th
percentile gap need not follow the budget), each point labelled with its budget, so "which budget
meets both targets" reads off one picture.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from minillm.widgets.palette import P95


def _label(budget) -> str:
    return "no budget" if budget is None else str(budget)


def draw_budget_sweep(rows: list[dict], title: str = "", unit: str = "ms", no_budget_x: float | None = None):
    """``rows``: one dict per run with ``budget`` (None: no budget, the paged engine), ``ttft_p95``,
    ``itl_p95`` and ``itl_max`` in seconds. A run with no budget is drawn at ``no_budget_x`` (four
    times the largest budget by default: two octaves right, clear of its label). Returns the Figure."""
    scale = {"ms": 1e3, "s": 1.0}[unit]
    budgets = [r["budget"] for r in rows if r["budget"] is not None]
    far = no_budget_x or 4 * max(budgets, default=1)
    xs = [far if r["budget"] is None else r["budget"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8))
    left.plot(xs, [r["ttft_p95"] * scale for r in rows], "o-", color="#e69f00", label="TTFT p95")
    itl_axis = left.twinx()
    itl_axis.plot(xs, [r["itl_p95"] * scale for r in rows], "s-", color="#0072b2", label="ITL p95")
    itl_axis.plot(xs, [r["itl_max"] * scale for r in rows], "^--", color=P95, label="longest gap (ITL max)")
    left.set_xscale("log", base=2)
    left.set_xticks(xs, [_label(r["budget"]) for r in rows], fontsize=8)
    left.minorticks_off()
    left.set_xlabel("max_num_batched_tokens (tokens per step)")
    left.set_ylabel(f"TTFT p95 ({unit})", color="#e69f00")
    itl_axis.set_ylabel(f"ITL ({unit})", color="#0072b2")
    left.set_ylim(bottom=0)
    itl_axis.set_ylim(bottom=0)
    handles = left.get_legend_handles_labels()[0] + itl_axis.get_legend_handles_labels()[0]
    left.legend(handles=handles, fontsize=8, frameon=False, loc="upper center")

    right.plot([r["itl_max"] * scale for r in rows], [r["ttft_p95"] * scale for r in rows], "o-", color="#555555")
    for r in rows:
        right.annotate(
            _label(r["budget"]),
            (r["itl_max"] * scale, r["ttft_p95"] * scale),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    right.set_xlabel(f"longest gap between two tokens, ITL max ({unit})")
    right.set_ylabel(f"TTFT p95 ({unit})")
    right.set_title("the trade-off: each point one budget", fontsize=9)
    right.set_xlim(left=0)
    right.set_ylim(bottom=0)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_stall(runs: dict, decoding: list[str], arrivals: list[float] = (), title: str = "", unit: str = "ms"):
    """The stall, drawn: for each run (``{label: outputs}``, the same requests), one row per request in
    ``decoding`` with a tick at every token it received, and the run's longest gap between two tokens
    of those requests shaded (gid ``longest-gap-<label>``). ``arrivals``: times (seconds from the run's
    start) at which the prompts that stall them arrive, dotted. Ticks carry gid ``tokens-<label>-<id>``.
    Returns the Figure."""
    scale = {"ms": 1e3, "s": 1.0}[unit]
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 0.9 + 0.55 * len(decoding) * len(runs)), sharex=True)
    for ax, (label, outputs) in zip(np.atleast_1d(axes), runs.items()):
        by_id = {o.request_id: o for o in outputs}
        start = min(o.metrics.arrival_time for o in outputs)
        longest = (0.0, None, None)  # (gap, row, time of the token before it)
        for row, rid in enumerate(decoding):
            times = [t - start for t in by_id[rid].metrics.token_times]
            ax.eventplot(
                [np.asarray(times) * scale],
                lineoffsets=row,
                linelengths=0.7,
                linewidths=0.8,
                colors="#0072b2",
                gid=f"tokens-{label}-{rid}",
            )
            for a, b in zip(times, times[1:]):
                if b - a > longest[0]:
                    longest = (b - a, row, a)
        gap, row, before = longest
        if row is not None:
            ax.add_patch(
                plt.Rectangle(
                    (before * scale, row - 0.45), gap * scale, 0.9, color=P95, alpha=0.3, gid=f"longest-gap-{label}"
                )
            )
            ax.annotate(
                f"longest gap {gap * scale:.1f} {unit}",
                ((before + gap) * scale, row),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
                color=P95,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1},
            )
        for t in arrivals:
            ax.axvline(t * scale, color="#999999", ls=":", lw=1)
        ax.set_yticks(range(len(decoding)), [f"request {rid}" for rid in decoding], fontsize=8)
        ax.set_ylim(len(decoding) - 0.5, -0.5)
        ax.set_title(label, fontsize=9, loc="left")
    np.atleast_1d(axes)[-1].set_xlabel(f"{unit} since the first arrival (dotted: a long prompt arrives)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_budget_throughput(rows: list[dict], title: str = ""):
    """Throughput against the budget when the server is saturated (every request waiting). ``rows``: one
    dict per run with ``budget`` (None: no budget), ``tps`` (output tokens/s), ``decode_steps`` (steps
    that ran decodes only) and ``chunk_steps`` (steps that also ran a prefill or a chunk of one). Left:
    tokens/s per budget, the run with no budget as a dashed line (gid ``no-budget``). Right: each run's
    steps, stacked: a smaller budget lets decodes ride in more of the prefill steps (fewer decode-only
    steps) but cuts prompts into more steps, each paying for a pass. Bars carry gids
    ``decode-<budget>`` and ``chunk-<budget>``. Returns the Figure."""
    budgeted = [r for r in rows if r["budget"] is not None]
    labels = [_label(r["budget"]) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.6))
    left.plot([r["budget"] for r in budgeted], [r["tps"] for r in budgeted], "o-", color="#0072b2", gid="tps")
    for r in budgeted:
        left.annotate(
            f"{r['tps']:,.0f}",
            (r["budget"], r["tps"]),
            xytext=(0, 6),
            textcoords="offset points",
            ha="center",
            fontsize=8,
        )
    for r in rows:
        if r["budget"] is None:
            left.axhline(r["tps"], color="#555555", ls="--", gid="no-budget", label=f"no budget: {r['tps']:,.0f}")
            left.legend(fontsize=8, frameon=False, loc="lower right")
    left.set_xscale("log", base=2)
    left.set_xticks([r["budget"] for r in budgeted], [_label(r["budget"]) for r in budgeted], fontsize=8)
    left.minorticks_off()
    left.set(xlabel="max_num_batched_tokens (tokens per step)", ylabel="output tokens/s")
    left.set_ylim(bottom=0, top=1.15 * max(r["tps"] for r in rows))
    x = np.arange(len(rows))
    for i, r in enumerate(rows):
        right.bar(
            i, r["decode_steps"], color="#0072b2", gid=f"decode-{labels[i]}", label="decodes only" if i == 0 else None
        )
        right.bar(
            i,
            r["chunk_steps"],
            bottom=r["decode_steps"],
            color="#e69f00",
            gid=f"chunk-{labels[i]}",
            label="with a prefill chunk" if i == 0 else None,
        )
    right.set_xticks(x, labels, fontsize=8)
    right.set(xlabel="max_num_batched_tokens", ylabel="engine steps in the run")
    right.legend(fontsize=8, frameon=False)
    for ax in (left, right):
        ax.grid(True, axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def chunk_rereads(prompt_len: int, chunk: int) -> int:
    """KV tokens a prompt's chunks read again: each chunk's queries read every token the chunks
    before it computed, so ``n`` chunks of ``chunk`` tokens re-read ``chunk * (0 + 1 + ... + (n - 1))``."""
    n = -(-prompt_len // chunk)
    return sum(i * chunk for i in range(n))


def draw_chunk_costs(prompt_len: int, chunks: list[int], ttft_s: list[float], title: str = "", unit: str = "ms"):
    """What cutting one ``prompt_len``-token prompt into chunks costs. Left: its time to first token
    with each chunk size (``ttft_s``, measured, one value per ``chunks``): every chunk is a step that
    pays the whole model's weights and the host's work again. Right: the KV tokens its chunks read
    again (``chunk_rereads``), against the prompt's own length. Returns the Figure."""
    scale = 1e3 if unit == "ms" else 1.0
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    left.plot(chunks, [t * scale for t in ttft_s], "o-", color=P95, gid="ttft")
    for c, t in zip(chunks, ttft_s):
        steps = -(-prompt_len // c)
        left.annotate(
            f"{steps} step{'s' if steps > 1 else ''}",
            (c, t * scale),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize=7,
        )
    left.set_ylabel(f"time to first token ({unit})")
    left.set_title(f"one {prompt_len}-token prompt, alone: measured", fontsize=9)
    rereads = [chunk_rereads(prompt_len, c) for c in chunks]
    right.bar([str(c) for c in chunks], rereads, color="#999999", gid="rereads")
    itself = f"the prompt itself ({prompt_len} tokens)"
    right.axhline(prompt_len, color="black", linestyle=":", linewidth=1, label=itself)
    right.set_ylabel("KV tokens read again")
    right.set_title("what later chunks read of earlier ones", fontsize=9)
    right.legend(fontsize=8, frameon=False)
    left.set_xscale("log", base=2)
    for ax in (left, right):
        ax.set_xlabel("chunk size (token budget, tokens)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
