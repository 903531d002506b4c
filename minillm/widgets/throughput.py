"""Chapter 9's comparison: every system's output tokens per second on one workload (``minillm bench``).

    from minillm.widgets import draw_throughputs
    draw_throughputs(bench.bench(engines=("naive", ..., "chunked"), model="tiny", workload="tiny"))

One bar per system, transformers' baselines in grey and minillm's engines in blue, each labelled
with its figure and its ratio to the fastest baseline; the workload's roofline floor is a dashed line
where it fits on the axis, and otherwise the title says how far off it is.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from minillm.widgets.palette import COLORS, DECODE, IDLE


def draw_throughputs(report: dict, title: str = ""):
    """``report``: what ``minillm.benchmarks.bench.bench`` returns. Returns the Figure."""
    systems = report["systems"]
    baselines = [s for s in systems if s["system"].startswith("transformers")]
    best = max((s["output_tok_s"] for s in baselines), default=None)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(systems) + 1.2))
    names = [s["system"] for s in systems][::-1]
    rates = [s["output_tok_s"] for s in systems][::-1]
    colors = [COLORS[IDLE] if s["system"].startswith("transformers") else COLORS[DECODE] for s in systems][::-1]
    ax.barh(names, rates, color=colors)
    for y, rate in enumerate(rates):
        note = f" {rate:,.0f}" + (f"  ({rate / best:.2f}x the best baseline)" if best else "")
        ax.text(rate, y, note, va="center", fontsize=8)
    right = max(rates) * 1.9  # room for the longest bar's label
    floor = report["floor"]
    floor_rate, where = floor["floor_output_tok_s"], ""
    if floor_rate <= right:
        ax.axvline(floor_rate, color="#555555", linestyle="--", linewidth=1, gid="floor")
        right = max(right, floor_rate * 1.05)
    else:
        where = f", {floor_rate / max(rates):,.0f}x the fastest bar: off this axis"
    ax.set_xlim(0, right)
    ax.set_xlabel("output tokens per second")
    ax.set_title(
        title
        or f"{report['workload']['requests']} requests, {report['workload']['output_tokens']:,} output tokens; "
        f"the roofline floor allows {floor_rate:,.0f} tok/s ({floor['bound']}-bound{where})",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
