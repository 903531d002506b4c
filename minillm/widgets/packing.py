"""Token packing: three ways to lay out one engine step that mixes new prompts with decodes
(chapter 4).

- chapter 3's engine: a forward pass per new prompt, then one pass for all decode tokens;
- a padded ``[B, T]`` rectangle (chapter 2's layout): one pass, every row padded to the longest;
- one flat batch (selective batching): every segment after the other, ``cu_seqlens`` marking where
  each starts.

    from minillm.widgets import draw_packing, packing_layouts
    draw_packing(llm.trace[12])          # any StepRecord
    packing_layouts(llm.trace[12])       # the same three layouts as data
    draw_ragged_mask(q_lens, context_lens)   # attention's view: which keys each query of the flat batch sees
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from minillm.widgets import palette


@dataclass
class PackingLayouts:
    """One step's three layouts. Request ids are in the plan's order (the flat batch's order)."""

    ids: list[str]
    lengths: list[int]  # tokens each request computes this step
    prefill_ids: list[str]
    passes: list[list[str]]  # chapter 3's engine: one list per forward pass
    padded_width: int  # T of the padded [B, T] rectangle
    cu_seqlens: list[int]  # the flat batch: where each segment starts, then the total

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def padded_rows(self) -> int:
        """Token rows the padded rectangle computes, padding included."""
        return len(self.ids) * self.padded_width


def packing_layouts(record) -> PackingLayouts:
    """The three layouts of one step (a ``StepRecord``)."""
    ids = list(record.num_scheduled_tokens)
    lengths = [record.num_scheduled_tokens[rid] for rid in ids]
    prefills = [rid for rid in ids if rid in record.prefill_ids]
    decodes = [rid for rid in ids if rid not in record.prefill_ids]
    passes = [[rid] for rid in prefills] + ([decodes] if decodes else [])
    return PackingLayouts(ids, lengths, prefills, passes, max(lengths, default=0), [0, *accumulate(lengths)])


def draw_packing(record, fig=None, labels: dict | None = None):
    """The three layouts of one step, one above the other on the same token axis. Returns the
    Figure; its three Axes are titled with what each layout computes. Every request's patch has
    ``gid`` ``<layout>-<request id>`` (layouts ``passes``, ``padded``, ``flat``)."""
    lay = packing_layouts(record)
    name = (lambda rid: labels.get(rid, rid)) if labels else (lambda rid: rid)
    if fig is None:
        fig = plt.figure(figsize=(10, 1.8 + 0.45 * (len(lay.passes) + len(lay.ids) + 2)))
    ax_passes, ax_padded, ax_flat = fig.subplots(
        3, 1, gridspec_kw={"height_ratios": (len(lay.passes) + 0.4, max(len(lay.ids), 1), 1.4)}
    )

    def phase(rid):
        return palette.PREFILL if rid in lay.prefill_ids else palette.DECODE

    def color(rid):
        return palette.COLORS[phase(rid)]

    def text_color(rid):
        return palette.TEXT_ON[phase(rid)]

    length = dict(zip(lay.ids, lay.lengths))

    for row, members in enumerate(lay.passes):  # chapter 3: a pass per new prompt, one for all decodes
        x = 0
        for rid in members:
            ax_passes.add_patch(
                Rectangle((x, row), length[rid], 0.8, color=color(rid), ec="white", lw=1, gid=f"passes-{rid}")
            )
            x += length[rid]
        what = (
            f"prefill of request {name(members[0])}, {x} tokens"
            if members[0] in lay.prefill_ids
            else f"decodes of requests {', '.join(map(name, members))}, one token each"
        )
        ax_passes.text(x + 0.5, row + 0.4, f"pass {row + 1}: {what}", va="center", fontsize=8)
    ax_passes.set(ylim=(len(lay.passes), -0.2), title=f"chapter 3's engine: {len(lay.passes)} forward passes")

    for row, (rid, n) in enumerate(zip(lay.ids, lay.lengths)):  # padded rectangle: left padding, as in chapter 2
        ax_padded.add_patch(Rectangle((0, row), lay.padded_width - n, 0.8, color=palette.COLORS[palette.IDLE]))
        ax_padded.add_patch(Rectangle((lay.padded_width - n, row), n, 0.8, color=color(rid), gid=f"padded-{rid}"))
        ax_padded.text(-0.5, row + 0.4, name(rid), ha="right", va="center", fontsize=8)
    ax_padded.set(
        ylim=(max(len(lay.ids), 1), -0.2),
        title=f"one padded [{len(lay.ids)}, {lay.padded_width}] pass: {lay.padded_rows} token rows "
        f"for {lay.num_tokens} tokens",
    )

    for rid, n, start in zip(lay.ids, lay.lengths, lay.cu_seqlens):  # one flat batch
        ax_flat.add_patch(Rectangle((start, 0), n, 0.8, color=color(rid), ec="white", lw=1, gid=f"flat-{rid}"))
        ax_flat.text(
            start + n / 2, 0.4, name(rid), ha="center", va="center", fontsize=8, color=text_color(rid), clip_on=True
        )
    ax_flat.set(ylim=(1.4, -0.2), title=f"selective batching: one flat pass of {lay.num_tokens} tokens")
    ax_flat.set_xticks(_spread(lay.cu_seqlens, max(lay.num_tokens, 1)))
    ax_flat.set_xlabel("cu_seqlens: where each request's tokens start in the flat batch")

    for ax in (ax_passes, ax_padded, ax_flat):
        ax.set_xlim(-2, max(lay.padded_width * 1.6, lay.num_tokens + 2))
        ax.set_yticks([])
        ax.title.set_fontsize(9)
    handles = [
        Patch(color=palette.COLORS[palette.PREFILL], label="prompt token (prefill)"),
        Patch(color=palette.COLORS[palette.DECODE], label="decode token"),
        Patch(color=palette.COLORS[palette.IDLE], label="padding"),
    ]
    ax_passes.legend(handles=handles, fontsize=8, loc="lower right", frameon=False)
    fig.suptitle(
        f"engine step {record.step}: {len(lay.prefill_ids)} prefill and {len(lay.ids) - len(lay.prefill_ids)} decodes",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _spread(ticks: list[int], total: int, min_gap: float = 0.025) -> list[int]:
    """``cu_seqlens`` as tick positions, leaving out inner ones that would crowd their left
    neighbour (closer than ``min_gap`` of the axis); the first and last always stay."""
    kept = []
    for i, t in enumerate(ticks):
        if not kept or i == len(ticks) - 1 or t - kept[-1] >= min_gap * total:
            kept.append(t)
    if len(kept) > 2 and kept[-1] - kept[-2] < min_gap * total:
        del kept[-2]
    return kept


def ragged_mask(q_lens: list[int], context_lens: list[int]) -> np.ndarray:
    """``mask[i, j]``: whether query token i of the flat batch attends to key j, keys laid out request
    after request (each request's whole context: cached tokens, then this step's). Segment s's
    queries are its context's last ``q_lens[s]`` positions, and each sees its own request's keys up
    to its own position: causal within a request, nothing across requests."""
    mask = np.zeros((sum(q_lens), sum(context_lens)), dtype=bool)
    row, col = 0, 0
    for q, ctx in zip(q_lens, context_lens):
        for i in range(q):  # query i sits at position ctx - q + i and sees keys 0..that position
            mask[row + i, col : col + ctx - q + i + 1] = True
        row, col = row + q, col + ctx
    return mask


def draw_ragged_mask(q_lens: list[int], context_lens: list[int], ids: list[str] | None = None, title: str = ""):
    """``ragged_mask`` as a picture: a row per query token of the flat batch, a column per key,
    allowed pairs dark; each request's block outlined and named. The image has ``gid`` ``mask``.
    Returns the Figure."""
    mask = ragged_mask(q_lens, context_lens)
    fig, ax = plt.subplots(figsize=(11, max(2.5, min(6.0, 0.9 + 0.06 * mask.shape[0]))))
    ax.imshow(mask, aspect="auto", cmap="Greys", vmin=0, vmax=1.4, interpolation="nearest", gid="mask")
    cu_q, cu_k = [0, *accumulate(q_lens)], [0, *accumulate(context_lens)]
    for s, rid in enumerate(ids or [str(i) for i in range(len(q_lens))]):
        ax.add_patch(
            Rectangle(
                (cu_k[s] - 0.5, cu_q[s] - 0.5),
                context_lens[s],
                q_lens[s],
                fill=False,
                edgecolor=palette.HIGHLIGHT,
                lw=1,
            )
        )
        ax.text(cu_k[s] + context_lens[s] / 2, cu_q[s] - 0.6, rid, ha="center", va="bottom", fontsize=7, clip_on=False)
    ax.set_xlabel("key: every request's context, one after the other (cached tokens, then this step's)")
    ax.set_ylabel("query token of the flat batch")
    allowed = int(mask.sum())
    ax.set_title(
        title
        or f"{allowed:,} of {mask.size:,} (query, key) pairs are computed ({allowed / mask.size:.1%}): "
        "each query sees its own request's keys, up to its own position",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
