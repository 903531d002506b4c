"""KV memory over a run: what the engine set aside vs what the tokens use (chapter 5).

    from minillm.widgets import draw_kv_memory, kv_memory_use
    draw_kv_memory({"contiguous": selective.trace, "paged": paged.trace})
    draw_block_size_sweep(rows)   # waste and throughput against the block size (the vLLM paper's ablation)
    draw_memory_sweep(runs)       # KV memory -> requests at once -> throughput, one line per engine

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


def draw_block_size_sweep(rows: list[dict], title: str = ""):
    """The block size's trade-off, one point per run: ``rows`` hold ``block_size``, ``waste`` (the
    unused share of the blocks held, 0-1), ``mean_running`` and ``tps`` (output tokens/s). Left:
    waste against the block size (a request's last block is partly empty, so waste grows with it).
    Right: requests running at once and throughput. Lines carry gids ``waste``, ``running``, ``tps``.
    Returns the Figure."""
    sizes = [r["block_size"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4))
    left.plot(sizes, [100 * r["waste"] for r in rows], "o-", color="#d55e00", gid="waste")
    left.set(xlabel="block_size (tokens)", ylabel="unused share of the blocks held (%)", xscale="log")
    left.set_ylim(bottom=0)
    right.plot(sizes, [r["mean_running"] for r in rows], "o-", color="#0072b2", gid="running", label="requests at once")
    right.set(xlabel="block_size (tokens)", ylabel="requests running at once (mean)", xscale="log")
    right.set_ylim(bottom=0)
    tps_axis = right.twinx()
    tps_axis.plot(sizes, [r["tps"] for r in rows], "s--", color="#555555", gid="tps", label="output tok/s")
    tps_axis.set_ylabel("output tokens/s")
    tps_axis.set_ylim(bottom=0)
    right.legend(handles=right.get_lines() + tps_axis.get_lines(), fontsize=8, loc="lower left", frameon=False)
    for ax in (left, right):
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_memory_sweep(runs: dict, title: str = ""):
    """What KV memory buys: ``runs`` maps an engine to rows with ``memory_gib``, ``mean_running`` and
    ``tps`` (output tokens/s). Left: requests running at once against the memory; right: throughput.
    Lines carry gids ``running-<engine>`` and ``tps-<engine>``. Returns the Figure."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4))
    for engine, rows in runs.items():
        gib = [r["memory_gib"] for r in rows]
        left.plot(gib, [r["mean_running"] for r in rows], "o-", label=engine, gid=f"running-{engine}")
        right.plot(gib, [r["tps"] for r in rows], "o-", label=engine, gid=f"tps-{engine}")
    left.set(ylabel="requests running at once (mean)")
    right.set(ylabel="output tokens/s")
    for ax in (left, right):
        ax.set(xlabel="KV memory (GiB)", xscale="log")
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
