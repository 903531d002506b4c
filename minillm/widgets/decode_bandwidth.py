"""Chapter 5b's case for split-KV decoding: a decode kernel's bandwidth against the batch size.

    from minillm.widgets import draw_decode_bandwidth
    draw_decode_bandwidth(record["rows"], record["copy_gb_s"], num_kv_heads=8)

``record`` is the ``paged_attention`` section of a ``gpu_check`` result: rows of ``batch``,
``context`` and ``gb_s``. One line per context length, the device copy's bandwidth dashed above, and
each point labelled with the programs the kernel launched (one per request and KV head): few
programs leave most of the GPU idle however long each one reads.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from minillm.widgets.roofline import DEVICE_COLORS


def draw_decode_bandwidth(rows: list[dict], copy_gb_s: float, num_kv_heads: int, title: str = ""):
    """``rows``: dicts with ``batch``, ``context`` and ``gb_s`` (the K/V bytes read per second).
    Returns the Figure."""
    fig, ax = plt.subplots(figsize=(9, 3.8))
    contexts = sorted({r["context"] for r in rows})
    for context, color in zip(contexts, DEVICE_COLORS * 4):
        line = sorted((r["batch"], r["gb_s"]) for r in rows if r["context"] == context)
        ax.plot(
            [b for b, _ in line],
            [g for _, g in line],
            "o-",
            color=color,
            label=f"context {context:,}",
            gid=f"context-{context}",
        )
    for batch in sorted({r["batch"] for r in rows}):
        top = max(r["gb_s"] for r in rows if r["batch"] == batch)
        ax.annotate(
            f"{batch * num_kv_heads:,} programs",
            (batch, top),
            textcoords="offset points",
            xytext=(0, 7),
            ha="center",
            fontsize=7,
        )
    ax.axhline(copy_gb_s, color="black", linestyle="--", linewidth=1, label=f"device copy ({copy_gb_s:,.0f} GB/s)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("requests decoding (batch)")
    ax.set_ylabel("K/V read (GB/s)")
    ax.set_title(title or "a decode kernel's bandwidth: one program per request and KV head", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    fig.tight_layout()
    return fig
