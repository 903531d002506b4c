"""KV memory over a run: what the engine set aside vs what the tokens use (chapter 5).

    from minillm.widgets import draw_kv_memory, kv_memory_use
    draw_kv_memory({"contiguous": selective.trace, "paged": paged.trace})
    draw_block_size_sweep(rows)   # waste and throughput against the block size (the vLLM paper's ablation)
    draw_memory_sweep(runs)       # KV memory -> requests at once -> throughput, one line per engine
    draw_kv_waste_by_cause({"contiguous": kv_waste_by_cause(selective.trace, reservation),
                            "paged": kv_waste_by_cause(paged.trace)})   # the vLLM paper's taxonomy

Every step of a ``Trace`` records ``kv_allocated_tokens`` (memory set aside, in tokens: blocks held,
or a reservation for the whole sequence) and ``kv_tokens`` (tokens actually in the cache). The gap
between the two is memory no other request can use: the waste paging is built to remove.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt

from minillm.widgets.block_map import block_tables_per_step


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


@dataclass
class KVWasteByCause:
    """The KV memory a run held, slot by slot, split the way the vLLM paper splits it (Kwon et al.,
    SOSP 2023, §3.1 and Fig. 3), in token-steps like ``KVMemoryUse``. The paper's fourth cause,
    external fragmentation (free memory between allocations too small for any request), is not here:
    see ``kv_waste_by_cause``."""

    tokens: int  # slots holding a token's keys and values
    reserved: int  # empty now, filled later by a token the request has yet to compute
    internal: int  # past the last token the request ever stores: never filled (internal fragmentation)

    @property
    def allocated(self) -> int:
        return self.tokens + self.reserved + self.internal

    def shares(self) -> dict[str, float]:
        """Each cause's share of the memory set aside (they add up to 1)."""
        total = self.allocated or 1
        return {"tokens": self.tokens / total, "reserved": self.reserved / total, "internal": self.internal / total}


def kv_waste_by_cause(trace, reservation: dict[str, int] | None = None) -> KVWasteByCause:
    """Split the KV memory each request holds after every step by what its slots hold. A request's
    slots are its positions 0, 1, 2, ...: the first ``stored`` hold tokens, those up to the most it
    ever stores are *reserved* (a later token fills them), the rest are *internal fragmentation*.

    What a request holds: with ``reservation`` (request id -> tokens: a contiguous engine's prompt +
    ``max_tokens``, or any what-if), that many slots from the step it is admitted to the step it
    finishes; without it, its block table's blocks x ``trace.block_size`` (the paged engine). A
    request's stored tokens are the tokens scheduled for it so far, so a run with prefix caching
    (a cached prefix is stored without being scheduled, and shared) is not split right.

    External fragmentation is not measured: minillm's contiguous engines admit against a count of
    free tokens, as if memory were one compacted heap, and give each request a tensor of its own
    whose address is the framework allocator's business, not the trace's. A paged pool has none:
    any free block fits any request."""
    tables_per_step = block_tables_per_step(trace) if reservation is None else None
    stored: dict[str, int] = {}  # request id -> tokens in its cache now
    most: dict[str, int] = {}  # request id -> the most tokens it ever stores
    held_per_step = []  # per step: request id -> (tokens stored, slots held)
    for i, record in enumerate(trace):
        for rid in record.preempted_ids:
            if rid not in record.swapped_out_ids:  # preempted by recompute: its tokens are computed again
                stored[rid] = 0
        for rid, n in record.num_scheduled_tokens.items():
            stored[rid] = stored.get(rid, 0) + n
            most[rid] = max(most.get(rid, 0), stored[rid])
        if reservation is None:
            slots = {rid: len(blocks) * trace.block_size for rid, blocks in tables_per_step[i].items() if blocks}
        else:
            slots = {rid: reservation[rid] for rid in record.slots if rid not in record.finished_ids}
        held_per_step.append({rid: (stored.get(rid, 0), n) for rid, n in slots.items()})
    tokens = reserved = internal = 0
    for held in held_per_step:
        for rid, (n_stored, n_slots) in held.items():
            ever_filled = min(n_slots, most.get(rid, 0))  # its slots that some token fills, now or later
            tokens += n_stored
            reserved += ever_filled - n_stored
            internal += n_slots - ever_filled
    return KVWasteByCause(tokens, reserved, internal)


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


CAUSE_COLORS = {"tokens": "#333333", "reserved": "#999999", "internal": "#d55e00"}  # the block map's gauge greys
CAUSE_LABELS = {
    "tokens": "holds a token",
    "reserved": "reserved: a later token fills it",
    "internal": "internal fragmentation: never filled",
}


def draw_kv_waste_by_cause(splits: dict, ax=None, title: str = ""):
    """The vLLM paper's waste taxonomy (Kwon et al., SOSP 2023, Fig. 2) measured: ``splits`` maps a
    label to a ``KVWasteByCause``; one bar each, its memory set aside split into tokens, reserved
    slots and internal fragmentation, in percent, the total in token-steps at its end (the bars are
    shares, so a policy that sets aside five times more still draws as long). Segments carry gids
    ``<cause>:<label>``. Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.7 + 0.6 * len(splits)))
    labels = list(splits)
    for row, label in enumerate(labels):
        left = 0.0
        for cause, share in splits[label].shares().items():
            ax.barh(row, 100 * share, left=left, color=CAUSE_COLORS[cause], height=0.6, gid=f"{cause}:{label}")
            if share >= 0.06:  # room for its number
                color = "white" if cause != "reserved" else "black"
                ax.text(left + 50 * share, row, f"{share:.0%}", ha="center", va="center", fontsize=8, color=color)
            left += 100 * share
        ax.text(101, row, f"{splits[label].allocated:,} token-steps", va="center", fontsize=8, gid=f"total:{label}")
    ax.set_yticks(range(len(labels)), labels, fontsize=9)
    ax.invert_yaxis()  # the first label on top
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the KV memory set aside (%), summed over the run's steps")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=CAUSE_COLORS[c]) for c in CAUSE_LABELS]
    ax.legend(
        handles, CAUSE_LABELS.values(), fontsize=8, frameon=False, ncols=3, loc="lower left", bbox_to_anchor=(0, 1)
    )
    if title:
        ax.set_title(title, fontsize=10, loc="left", pad=24)
    return ax
