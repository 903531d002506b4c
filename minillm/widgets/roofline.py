"""Chapter 9's roofline: how long a decode step must take on a device, against the batch size.

    from minillm.widgets import draw_roofline
    draw_roofline([1, 2, 4, ...], {"this CPU": {"ridge": 7.7, "intensity": [...], "floor_s": [...]}, ...},
                  measured={1: 0.004, 2: 0.003, ...})

Left: the step's arithmetic intensity (FLOPs per byte moved) against the batch size, and each
device's ridge point (its FLOP/s over its bytes/s): below its ridge a device waits on memory, above
it on arithmetic, so where a device's line crosses the intensity curve is the batch at which decode
stops being memory-bound there. Right: the least time a step can take on each device (log-log),
and the step times measured on this one, per step and per token.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

DEVICE_COLORS = ("#0072b2", "#009e73", "#cc79a7")  # one per device, in the order given
MEASURED = "#d55e00"


def draw_roofline(batches: list[int], devices: dict[str, dict], measured: dict[int, float] | None = None, title=""):
    """``devices``: name -> ``{"ridge": FLOP/byte, "intensity": [...], "floor_s": [...]}``, the last
    two one value per batch in ``batches``; ``measured``: batch -> the median step time measured on
    the first device, in seconds. Returns the Figure."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    for (name, d), color in zip(devices.items(), DEVICE_COLORS):
        if name == next(iter(devices)):
            left.plot(batches, d["intensity"], "o-", color="#555555", label="a decode step's FLOPs per byte")
        left.axhline(d["ridge"], color=color, linestyle="--", label=f"{name}: ridge point {d['ridge']:,.0f}")
        right.plot(batches, [s * 1e3 for s in d["floor_s"]], "-", color=color, label=f"{name}: the floor")
    if measured:
        xs = sorted(measured)
        right.plot(xs, [measured[b] * 1e3 for b in xs], "o-", color=MEASURED, label="measured here: one step")
        right.plot(xs, [measured[b] * 1e3 / b for b in xs], "s:", color=MEASURED, label="measured here: per token")
    left.set_xlabel("batch size (requests decoding)")
    left.set_ylabel("FLOPs per byte")
    left.set_title("memory-bound below a device's ridge, compute-bound above it", fontsize=9)
    right.set_ylabel("ms")
    right.set_xlabel("batch size (requests decoding)")
    right.set_title("the least time a decode step can take, and what it took", fontsize=9)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend(fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
