"""Chapter 9's roofline: the roofline itself, and how long a decode step must take against the batch size.

    from minillm.widgets import draw_attainable, draw_roofline
    draw_attainable({"this CPU": {"peak_flops": 1.2e11, "memory_bandwidth": 3.1e10}, ...},
                    [{"label": "decode, batch 1", "intensity": 0.5, "flops_per_s": 2e8}, ...])
    draw_roofline([1, 2, 4, ...], {"this CPU": {"ridge": 7.7, "intensity": [...], "floor_s": [...]}, ...},
                  measured={1: 0.004, 2: 0.003, ...})

``draw_attainable`` is the picture of Williams, Waterman and Patterson (CACM 2009): the FLOP/s a
device can attain at an arithmetic intensity, ``min(peak FLOP/s, bandwidth x intensity)``, one roof
per device, with the steps measured on the first device placed at their intensity and the FLOP/s they
attained. A step sits on the sloped part of the roof at best when memory-bound, on the flat part when
compute-bound; how far below the roof it sits is time it spent doing neither.

Top: the step's intensity (FLOPs per byte moved) against the batch size, and each device's ridge
point (its FLOP/s over its bytes/s): below its ridge a device waits on memory, above it on
arithmetic, so where a device's line crosses the intensity curve is the batch at which decode stops
being memory-bound there. Bottom: the least time a step can take on each device (log-log), and the
step times measured on this one, each against its floor (a step's, not a token's: the largest
batch's time per token is written beside its point). The panels are stacked, so that a notebook
shows the figure at its size and its legends stay legible.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

DEVICE_COLORS = ("#0072b2", "#009e73", "#cc79a7")  # one per device, in the order given
MEASURED = "#d55e00"
STEP_MARKERS = "os^Dv"


def draw_attainable(devices: dict[str, dict], steps: list[dict], title=""):
    """``devices``: name -> ``{"peak_flops", "memory_bandwidth"}`` (per second); ``steps``: dicts
    ``{"label", "intensity", "flops_per_s"}``, measured on the first device. Returns the Figure."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ridges = [d["peak_flops"] / d["memory_bandwidth"] for d in devices.values()]
    xs = [s["intensity"] for s in steps] + ridges
    grid = np.geomspace(min(xs) / 4, max(xs) * 4, 200)
    for (name, d), ridge, color in zip(devices.items(), ridges, DEVICE_COLORS):
        roof = np.minimum(d["peak_flops"], d["memory_bandwidth"] * grid)
        ax.plot(grid, roof, "-", color=color, linewidth=2, label=f"{name}: the roof (ridge {ridge:,.0f} FLOP/byte)")
        ax.axvline(ridge, color=color, linestyle=":", linewidth=1)
    first = next(iter(devices.values()))
    for step, marker in zip(steps, STEP_MARKERS):
        x, y = step["intensity"], step["flops_per_s"]
        roof = min(first["peak_flops"], first["memory_bandwidth"] * x)
        ax.plot([x, x], [y, roof], ":", color=MEASURED, linewidth=1)
        ax.plot(
            x, y, marker, color=MEASURED, linestyle="none", label=f"{step['label']}: measured ({roof / y:,.0f}x below)"
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("operational intensity (FLOPs per byte of memory traffic)")
    ax.set_ylabel("FLOP/s")
    ax.set_title("attainable FLOP/s: memory's slope below the ridge, the arithmetic's ceiling above it", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="best")  # where it hides the fewest points
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_roofline(batches: list[int], devices: dict[str, dict], measured: dict[int, float] | None = None, title=""):
    """``devices``: name -> ``{"ridge": FLOP/byte, "intensity": [...], "floor_s": [...]}``, the last
    two one value per batch in ``batches``; ``measured``: batch -> the median step time measured on
    the first device, in seconds. Returns the Figure."""
    fig, (left, right) = plt.subplots(2, 1, figsize=(9, 7.5))
    for (name, d), color in zip(devices.items(), DEVICE_COLORS):
        if name == next(iter(devices)):
            left.plot(batches, d["intensity"], "o-", color="#555555", label="a decode step's FLOPs per byte")
        left.axhline(d["ridge"], color=color, linestyle="--", label=f"{name}: ridge point {d['ridge']:,.0f}")
        right.plot(batches, [s * 1e3 for s in d["floor_s"]], "-", color=color, label=f"{name}: the floor")
    if measured:
        xs = sorted(measured)
        right.plot(xs, [measured[b] * 1e3 for b in xs], "o-", color=MEASURED, label="measured here: one step")
        top = xs[-1]
        right.annotate(
            f"  {measured[top] * 1e3 / top:.2f} ms per token",
            (top, measured[top] * 1e3),
            fontsize=8,
            color=MEASURED,
            va="center",
        )
    left.set_xlabel("batch size (requests decoding)")
    left.set_ylabel("FLOPs per byte")
    left.set_title("memory-bound below a device's ridge, compute-bound above it", fontsize=9)
    right.set_ylabel("ms")
    right.set_xlabel("batch size (requests decoding)")
    right.set_title("the least time a decode step can take, and what it took", fontsize=9)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend(fontsize=8, frameon=False, loc="best")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
