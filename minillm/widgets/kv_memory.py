"""KV memory over a run: what the engine set aside vs what the tokens use (chapter 5).

    from minillm.widgets import draw_kv_memory, kv_memory_use
    draw_kv_memory({"contiguous": selective.trace, "paged": paged.trace})

Every step of a ``Trace`` records ``kv_allocated_tokens`` (memory set aside, in tokens: blocks held,
or a reservation for the whole sequence) and ``kv_tokens`` (tokens actually in the cache). The gap
between the two is memory no other request can use: the waste paging is built to remove.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt


@dataclass
class KVMemoryUse:
    """A run's KV memory summed over its steps (token-steps), so a long step and a short one weigh
    the same: what a time-average over steps would give."""

    held: int  # tokens in the cache, summed over steps
    allocated: int  # tokens' worth of memory set aside, summed over steps

    @property
    def used_fraction(self) -> float:
        return self.held / self.allocated if self.allocated else 1.0

    @property
    def waste(self) -> float:
        """The fraction of the memory set aside that held no token."""
        return 1.0 - self.used_fraction


def kv_memory_use(trace, allocated_per_step=None) -> KVMemoryUse:
    """Sum ``kv_tokens`` and ``kv_allocated_tokens`` over the steps of ``trace``. ``allocated_per_step``
    (one number per step) replaces the trace's allocation: a what-if policy on the same run."""
    held = sum(r.kv_tokens for r in trace)
    allocated = sum(allocated_per_step) if allocated_per_step is not None else sum(r.kv_allocated_tokens for r in trace)
    return KVMemoryUse(held, allocated)


def draw_kv_memory(runs: dict, ax=None, title: str = ""):
    """``runs``: ``{label: trace}``. Per run, the memory set aside (solid) and the tokens in it
    (dashed, same colour) at every step; the area between them is waste. Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 3.4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, trace) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        steps = [r.step for r in trace]
        allocated = [r.kv_allocated_tokens for r in trace]
        held = [r.kv_tokens for r in trace]
        waste = kv_memory_use(trace).waste
        ax.plot(steps, allocated, color=color, lw=1.6, label=f"{label}: set aside ({waste:.0%} unused)")
        ax.plot(steps, held, color=color, lw=1.0, ls="--", label=f"{label}: tokens in it")
        ax.fill_between(steps, held, allocated, color=color, alpha=0.12, lw=0)
    ax.set_xlabel("engine step")
    ax.set_ylabel("KV memory (tokens)")
    ax.set_ylim(bottom=0)
    ax.legend(
        fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0)
    )  # beside the curves, never on them
    if title:
        ax.set_title(title, fontsize=10)
    return ax
