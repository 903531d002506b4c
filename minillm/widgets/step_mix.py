"""Chapter 8b: what each step of a run contained -- prompt tokens and decode tokens -- for several
runs of the same requests, one above the other, so that servers' rules for a step can be told apart
at a glance: vLLM mixes decodes into every chunk's step, SGLang runs a prefill step *or* a decode step,
TGI decodes the step after it admits."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

PREFILL = "#e69f00"
DECODE = "#0072b2"


def step_mix(trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(starts, durations, prompt tokens, decode tokens)`` of each step of ``trace``."""
    starts = np.array([s.start_time for s in trace])
    durations = np.array([s.end_time - s.start_time for s in trace])
    decode = np.array([len(s.decode_ids) for s in trace])
    prefill = np.array([s.num_batched_tokens for s in trace]) - decode
    return starts, durations, prefill, decode


def draw_step_mix(runs: dict, window: tuple[float, float] | None = None, title: str = "", unit: str = "ms") -> Figure:
    """One panel per run (``{label: trace}``): a bar per step, as wide as the step took, prompt tokens
    stacked on decode tokens, on a log axis; ``window`` (seconds) limits the time shown. The share of steps that
    carried both kinds is in each panel's title. Bars carry gid ``prefill-<label>`` / ``decode-<label>``.
    Returns the Figure."""
    scale = {"ms": 1e3, "s": 1.0}[unit]
    fig = plt.figure(figsize=(11, 0.6 + 1.5 * len(runs)))  # pyplot's: plt.show() draws it
    axes = np.atleast_1d(fig.subplots(len(runs), 1, sharex=True))
    for ax, (label, trace) in zip(axes, runs.items()):
        starts, durations, prefill, decode = step_mix(trace)
        keep = np.ones(len(starts), bool)
        if window is not None:
            keep = (starts + durations >= window[0]) & (starts <= window[1])
        x, w = starts[keep] * scale, durations[keep] * scale
        edges = dict(align="edge", edgecolor="white", linewidth=0.4)  # a thin gap between two steps
        ax.bar(x, decode[keep], width=w, color=DECODE, gid=f"decode-{label}", label="decode tokens", **edges)
        ax.bar(
            x,
            prefill[keep],
            width=w,
            bottom=decode[keep],
            color=PREFILL,
            gid=f"prefill-{label}",
            label="prompt tokens",
            **edges,
        )
        both = np.mean((prefill > 0) & (decode > 0)) if len(trace) else 0.0
        ax.set_title(f"{label}: {len(trace)} steps, {both:.0%} carried prompt and decode tokens together", fontsize=9)
        ax.set_yscale("log")  # a few decode tokens beside thousands of prompt tokens: both visible
        ax.set_ylim(0.8, max(1.0, float((prefill + decode).max(initial=1))) * 2)
        ax.set_ylabel("tokens (log)")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel(f"time ({unit})")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
