"""KV block map: which request holds which physical KV cache block, step by step.

The paged engine splits the KV cache into ``num_gpu_blocks`` blocks of ``block_size`` tokens and
gives each request a block table (logical block i of the request -> a physical block id). This
widget draws the pool as a grid of cells, one per physical block, coloured by the request that
holds it (free blocks blank), the selected request's block table beside it, a gauge of used vs
allocated vs pool tokens, and the preemptions and swaps of the step.

With prefix caching (``enable_prefix_caching=True``) two more kinds of block appear: a block in
several requests' tables is *shared*, drawn in one colour per holder count (2, 3, 4+) and labelled
``×n``; a free block whose hash is still cached is drawn pale and hatched, apart from truly free
ones, because a later prompt with the same first tokens reuses it instead of computing it again.
A legend counts both.

    from minillm.widgets import block_map
    block_map(llm.trace, outputs)                        # step slider, play, request dropdown
    draw_block_map(trace, step=5, selected="2")          # the same picture as a plain matplotlib Axes
    draw_block_tables({"A": [0, 1, 3]}, num_blocks=8, block_size=4)   # logical -> physical, as arrows

It reads only the trace (``StepRecord.block_tables``, ``preempted_ids``, ``swapped_out_ids``,
``kv_tokens``, ``kv_allocated_tokens``, ``cached_free_blocks``; ``Trace.num_gpu_blocks``,
``Trace.block_size``), so the real engine and the simulator show the same way. Holder counts come
from the block tables alone: a block id in several tables at once.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import PatchCollection
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from minillm.widgets import palette
from minillm.widgets.figure_view import FigureView

FREE = "#ffffff"  # a free block: blank
CACHED_FREE = "#e8e8e8"  # a free block whose hash is still cached: pale ...
CACHED_HATCH = "////"  # ... and hatched
SHARED_COLORS = {2: "#f0e442", 3: "#c99a00", 4: "#6e5600"}  # held by 2, 3, 4+ requests: darker as more share
EVENT = palette.P95  # vermillion: preemption and swap marks
TABLE_COLUMNS = 8  # the selected request's block table wraps after this many blocks
TABLE_ROW_PITCH = 1.4  # a table row: its logical indices above a row of cells, clear of the row above
GAUGE_USED, GAUGE_ALLOCATED, GAUGE_POOL = "#333333", "#999999", "#eeeeee"


# --- the data: tables, owners, colours --------------------------------------------------------


def block_tables_per_step(trace) -> list[dict[str, list[int]]]:
    """The block tables after every step. A step records ``block_tables=None`` when nothing
    changed, so the last recorded tables carry forward (empty before the first record)."""
    current: dict[str, list[int]] = {}
    result = []
    for record in trace:
        tables = getattr(record, "block_tables", None)
        if tables is not None:
            current = {rid: list(blocks) for rid, blocks in tables.items()}
        result.append(current)
    return result


def block_tables_at(trace, step: int) -> dict[str, list[int]]:
    """The block tables held after ``step``, carried forward from the last step that recorded them."""
    current: dict[str, list[int]] = {}
    for i, record in enumerate(trace):
        if i > step:
            break
        tables = getattr(record, "block_tables", None)
        if tables is not None:
            current = tables
    return {rid: list(blocks) for rid, blocks in current.items()}


def cached_free_blocks_per_step(trace) -> list[list[int]]:
    """The free blocks still cached after every step, carried forward like the block tables: a step
    records ``cached_free_blocks=None`` when they did not change (and an engine without prefix
    caching never records them: every step then has none)."""
    current: list[int] = []
    result = []
    for record in trace:
        blocks = getattr(record, "cached_free_blocks", None)
        if blocks is not None:
            current = list(blocks)
        result.append(current)
    return result


def records_prefix_cache(trace) -> bool:
    """Whether the run had prefix caching on: its engine recorded the cached free blocks."""
    return any(getattr(record, "cached_free_blocks", None) is not None for record in trace)


def shared_color(num_holders: int) -> str:
    """The colour of a block held by ``num_holders`` (2 or more) requests at once."""
    return SHARED_COLORS[min(num_holders, max(SHARED_COLORS))]


def tab20_shades() -> list[str]:
    """tab20's colours, dark shades first, then light: neighbours in the list differ most."""
    cmap = plt.get_cmap("tab20")
    return [to_hex(cmap(i)) for i in [*range(0, 20, 2), *range(1, 20, 2)]]


def request_colors(trace) -> dict[str, str]:
    """One colour per request for the whole run, so a request keeps its colour at every step. A
    request that starts holding blocks takes a colour no holder of that step has (the one left
    unused longest), so requests in the pool together differ whenever at most 20 hold blocks at
    once (tab20, dark and light shades alternating); a long run reuses colours over time, never
    side by side. Past 20 holders at once, colours repeat (cell labels still tell them apart)."""
    shades = tab20_shades()
    colors: dict[str, str] = {}
    last_used = {shade: -1 for shade in shades}  # shade -> the last step a holder had it
    for step, record in enumerate(trace):
        tables = getattr(record, "block_tables", None) or {}
        busy = {colors[rid] for rid, blocks in tables.items() if blocks and rid in colors}
        for rid, blocks in tables.items():
            if rid not in colors and blocks:
                free = [shade for shade in shades if shade not in busy] or shades
                colors[rid] = min(free, key=lambda shade: last_used[shade])
                busy.add(colors[rid])
        for rid, blocks in tables.items():
            if blocks and rid in colors:
                last_used[colors[rid]] = step
    return colors


def pool_size(trace) -> tuple[int, int | None]:
    """``(num_gpu_blocks, block_size)`` from the trace, or inferred when it does not say: the pool
    as the highest block id seen + 1, the block size from allocated tokens / blocks held."""
    tables = [t for t in (getattr(r, "block_tables", None) for r in trace) if t]
    num_blocks = getattr(trace, "num_gpu_blocks", None)
    if num_blocks is None:
        num_blocks = 1 + max((b for t in tables for blocks in t.values() for b in blocks), default=-1)
    block_size = getattr(trace, "block_size", None)
    if block_size is None:
        for record, held in zip(trace, block_tables_per_step(trace)):
            num_held = sum(map(len, held.values()))
            if num_held and record.kv_allocated_tokens:
                block_size = record.kv_allocated_tokens // num_held
                break
    return max(num_blocks, 1), block_size


@dataclass
class BlockMapState:
    """One step of the map as data, so tests and the text below the widget read the same numbers."""

    step: int
    holders: list[list[str]]  # physical block id -> the requests holding it (several: shared), [] when free
    tables: dict[str, list[int]]
    freed_by_event: dict[int, str]  # block id -> "preempted" / "swapped out": held last step, freed by that event
    preempted: list[str]
    swapped_out: list[str]
    used_tokens: int  # tokens whose K/V are held, a shared block's once
    allocated_tokens: int  # blocks held x block_size, a shared block once
    capacity_tokens: int | None  # the whole pool in tokens (None: block size unknown)
    num_blocks: int
    block_size: int | None
    cached_free: list[int]  # free blocks whose hash is still cached (prefix caching), in id order
    saved_tokens: int  # what sharing saves: the tokens each extra holder of a shared block would need
    prefix_caching: bool  # the run had prefix caching on (the legend is drawn)

    @property
    def owners(self) -> list[str | None]:
        """Physical block id -> the (first) request holding it, None when free."""
        return [held[0] if held else None for held in self.holders]

    @property
    def num_used_blocks(self) -> int:
        return sum(bool(held) for held in self.holders)

    @property
    def num_holders(self) -> list[int]:
        """Physical block id -> how many requests hold it (2 or more: shared)."""
        return [len(held) for held in self.holders]


def block_map_state(trace, step: int, tables_per_step=None, cached_per_step=None) -> BlockMapState:
    """The map after ``step``. ``tables_per_step`` and ``cached_per_step`` (from
    ``block_tables_per_step`` and ``cached_free_blocks_per_step``) save recomputing what is carried
    forward for every step of a widget."""
    tables_per_step = tables_per_step if tables_per_step is not None else block_tables_per_step(trace)
    cached_per_step = cached_per_step if cached_per_step is not None else cached_free_blocks_per_step(trace)
    record = trace[step]
    num_blocks, block_size = pool_size(trace)
    tables = tables_per_step[step]
    holders: list[list[str]] = [[] for _ in range(num_blocks)]
    for rid, blocks in tables.items():
        for b in blocks:
            if 0 <= b < num_blocks:
                holders[b].append(rid)
    # The engine counts a shared block's tokens once per holder; the pool stores them once. Only
    # full blocks are shared, so each extra holder accounts for exactly block_size tokens.
    saved = (block_size or 0) * sum(len(held) - 1 for held in holders if held)
    preempted = list(record.preempted_ids)
    swapped = list(getattr(record, "swapped_out_ids", None) or [])
    before = tables_per_step[step - 1] if step > 0 else {}
    freed = {
        b: what
        for what, ids in (("preempted", preempted), ("swapped out", swapped))
        for rid in ids
        for b in before.get(rid, [])
        if 0 <= b < num_blocks and not holders[b]
    }
    if block_size:
        capacity = num_blocks * block_size
    else:
        capacity = record.kv_capacity_tokens or None
    return BlockMapState(
        step=step,
        holders=holders,
        tables=tables,
        freed_by_event=freed,
        preempted=preempted,
        swapped_out=swapped,
        used_tokens=record.kv_tokens - saved,
        allocated_tokens=record.kv_allocated_tokens - saved,
        capacity_tokens=capacity,
        num_blocks=num_blocks,
        block_size=block_size,
        cached_free=[b for b in cached_per_step[step] if 0 <= b < num_blocks and not holders[b]],
        saved_tokens=saved,
        prefix_caching=records_prefix_cache(trace),
    )


# --- drawing ----------------------------------------------------------------------------------


def grid_columns(num_blocks: int) -> int:
    """Cells per row: 16 up to 128 blocks (at most 8 rows), 32 beyond (512 blocks: 16 rows)."""
    return min(num_blocks, 16 if num_blocks <= 128 else 32)


def _text_color(color: str) -> str:
    r, g, b = to_rgb(color)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def _figsize(num_blocks: int, legend: bool = False) -> tuple[float, float]:
    cols = grid_columns(num_blocks)
    rows = math.ceil(num_blocks / cols)
    width = cols + 1.5 + TABLE_COLUMNS
    # At most 10 in (900 px): a notebook about 850 px wide shows it nearly at size, type readable;
    # a wide pool (32 columns) gets smaller cells instead of smaller type.
    return (min(10.0, 1.0 + 0.34 * width), 1.6 + 0.34 * (max(rows, 2) + 4 + 2 * legend))


def cell_color(state: BlockMapState, block: int, colors: dict, cached: set[int]) -> str:
    """A grid cell's fill: its holder's colour, a shared block's holder-count colour, or (free)
    pale when its hash is still cached and blank when not."""
    held = state.holders[block]
    if len(held) > 1:
        return shared_color(len(held))
    if held:
        return colors.get(held[0], "#7f7f7f")
    return CACHED_FREE if block in cached else FREE


def cell_label(state: BlockMapState, block: int, name) -> str:
    """A grid cell's text: its holder's name, ``×n`` for a block n requests share, none when free."""
    held = state.holders[block]
    return f"×{len(held)}" if len(held) > 1 else name(held[0]) if held else ""


def draw_block_map(
    trace,
    step: int,
    ax=None,
    selected: str | None = None,
    labels: dict | None = None,
    colors: dict | None = None,
    state: BlockMapState | None = None,
    table_rows: int = 0,
):
    """The block map after ``step`` as a static matplotlib picture; returns the Axes
    (``ax.figure`` is the Figure). ``selected``: a request id whose block table is drawn beside
    the grid and whose cells are outlined. ``labels`` names requests (``{"0": "A"}``).
    ``colors`` and ``state`` let the widget pass what it already computed; ``table_rows`` is the
    room kept for the table (the widget keeps the most any request needs, so that the picture keeps
    its height as the slider moves). A run with prefix caching adds shared blocks (``×n``), hatched
    free blocks still cached, and a legend."""
    state = state if state is not None else block_map_state(trace, step)
    colors = colors if colors is not None else request_colors(trace)
    name = (lambda rid: labels.get(rid, rid)) if labels else (lambda rid: rid)
    if ax is None:
        _, ax = plt.subplots(figsize=_figsize(state.num_blocks, state.prefix_caching))
    n = state.num_blocks
    cols = grid_columns(n)
    rows = math.ceil(n / cols)

    # the pool: one cell per physical block, row-major; cells past the pool's end are transparent
    cached = set(state.cached_free)
    fills = [cell_color(state, b, colors, cached) for b in range(n)]
    image = np.zeros((rows, cols, 4))
    for b, fill in enumerate(fills):
        image[b // cols, b % cols] = (*to_rgb(fill), 1.0)
    ax.imshow(image, extent=(0, cols, rows, 0), interpolation="nearest", gid="block-grid")
    if cached:
        ax.add_collection(_hatched([(b % cols, b // cols) for b in state.cached_free], "cached-free"))
    _draw_cell_borders(ax, n, cols)
    fontsize = 8 if cols <= 16 else 6
    texts = [cell_label(state, b, name) for b in range(n)]
    for b, text in enumerate(texts):
        run_start = b == 0 or texts[b - 1] != text or b % cols == 0
        if text and (n <= 128 or run_start):  # big pools: one label per run of cells
            ax.text(
                b % cols + 0.5,
                b // cols + 0.5,
                text,
                ha="center",
                va="center",
                fontsize=fontsize,
                color=_text_color(fills[b]),
                clip_on=True,
            )
    for b, what in state.freed_by_event.items():
        ax.plot(b % cols + 0.5, b // cols + 0.5, marker="x", color=EVENT, markersize=7, mew=1.8, gid=f"freed-{what}")
    columns = range(0, cols, 4 if cols > 16 else 2)
    ax.xaxis.tick_top()
    ax.set_xticks([c + 0.5 for c in columns], [str(c) for c in columns], fontsize=7)
    ax.set_yticks([r + 0.5 for r in range(rows)], [f"{r * cols}" for r in range(rows)], fontsize=7)
    ax.set_ylabel("physical block id =\nrow start + column", fontsize=8)
    ax.tick_params(length=0, pad=2)
    for side in ax.spines.values():
        side.set_visible(False)

    # the selected request's block table, beside the grid
    x0 = cols + 1.5
    table_bottom = max(_draw_table(ax, state, selected, name, colors, x0, cols), table_height(table_rows))

    # the gauge, below both, and with prefix caching the legend below it
    y0 = max(rows, table_bottom) + 0.6
    _draw_gauge(ax, state, y0, cols)
    bottom = y0 + 1.6
    if state.prefix_caching:
        _draw_legend(ax, state, bottom)
        bottom += 1.4

    holders = sum(1 for blocks in state.tables.values() if blocks)
    num_shared = sum(count > 1 for count in state.num_holders)
    title = (
        f"KV cache after step {state.step}: {state.num_used_blocks} of {n} blocks held by "
        f"{holders} request{'' if holders == 1 else 's'}"
    ) + (f", {num_shared} of them shared" if num_shared else "")
    events = [
        f"{what} {', '.join(map(name, ids))}"
        for what, ids in (("preempted", state.preempted), ("swapped out", state.swapped_out))
        if ids
    ]
    if events:  # between the title and the column numbers
        ax.annotate(
            "  ".join(events) + "   (x: blocks freed by it)",
            (0, 1),
            xycoords="axes fraction",
            xytext=(0, 16),
            textcoords="offset points",
            color=EVENT,
            fontsize=9,
            fontweight="bold",
            va="bottom",
            gid="events",
        )
    ax.set_title(title, fontsize=10, loc="left", pad=34)  # room for the events line, there or not: a steady height
    ax.set_xlim(-0.2, x0 + TABLE_COLUMNS + 0.2)
    ax.set_ylim(bottom, -0.6)
    ax.set_aspect("equal")
    return ax


def _hatched(cells: list[tuple[float, float]], gid: str) -> PatchCollection:
    """Hatching over unit cells at ``(x, y)``: one collection, however many cells."""
    squares = [Rectangle(xy, 1, 1) for xy in cells]
    return PatchCollection(squares, facecolor="none", edgecolor="#9a9a9a", linewidth=0, hatch=CACHED_HATCH, gid=gid)


def _draw_legend(ax, state: BlockMapState, y: float) -> None:
    """What prefix caching adds, with this step's counts: shared blocks by holder count, free blocks
    still cached, truly free blocks."""
    counts, top = state.num_holders, max(SHARED_COLORS)
    handles = []
    for k, color in SHARED_COLORS.items():
        num_blocks = sum(c >= k if k == top else c == k for c in counts)
        label = f"shared by {k}{'+' if k == top else ''}: {num_blocks}"
        handles.append(Patch(facecolor=color, edgecolor="#888888", label=label))
    handles += [
        Patch(
            facecolor=CACHED_FREE,
            edgecolor="#9a9a9a",
            hatch=CACHED_HATCH,
            label=f"free, prefix still cached: {len(state.cached_free)}",
        ),
        Patch(facecolor=FREE, edgecolor="#888888", label=f"free: {counts.count(0) - len(state.cached_free)}"),
    ]
    legend = ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(0, y),
        bbox_transform=ax.transData,
        ncol=len(handles),
        fontsize=7,
        frameon=False,
        handlelength=1.4,
        columnspacing=1.2,
        borderaxespad=0,
        title="blocks (×n: held by n requests at once)",
        title_fontsize=7,
        alignment="left",
    )
    legend.set_gid("block-legend")


def _draw_cell_borders(ax, num_blocks: int, cols: int) -> None:
    """Grid lines around the pool's cells only: a last row that is not full stops where the pool
    does, so cells that do not exist are not drawn as free blocks."""
    full_rows, last = divmod(num_blocks, cols)
    style = dict(colors="#bbbbbb", linewidth=0.6, gid="cell-borders")
    ax.vlines(range(cols + 1), 0, full_rows, **style)
    ax.hlines(range(full_rows + 1), 0, cols, **style)
    if last:
        ax.vlines(range(last + 1), full_rows, full_rows + 1, **style)
        ax.hlines(full_rows + 1, 0, last, **style)


def _draw_table(ax, state: BlockMapState, selected, name, colors, x0: float, cols: int) -> float:
    """The selected request's block table as cells of physical ids under their logical index;
    outlines its blocks in the grid; names the requests it shares blocks with. Returns the y the
    table ends at."""
    if selected is None or selected not in state.tables:
        note = "no request selected: no block table drawn" if selected is None else f"{name(selected)} holds no blocks"
        ax.text(x0, 0.5, note, fontsize=8, va="center", color="#555555", gid="table-empty")
        return 1.0
    blocks = state.tables[selected]
    ax.text(x0, -0.2, f"block table of {name(selected)}: logical -> physical", fontsize=8, va="bottom")
    for i, b in enumerate(blocks):
        x, y = x0 + i % TABLE_COLUMNS, 0.4 + TABLE_ROW_PITCH * (i // TABLE_COLUMNS)
        shared = 0 <= b < state.num_blocks and len(state.holders[b]) > 1
        color = shared_color(len(state.holders[b])) if shared else colors.get(selected, "#7f7f7f")
        ax.add_patch(Rectangle((x, y + 0.35), 1, 1, facecolor=color, edgecolor="white", linewidth=1, gid="table-cell"))
        ax.text(x + 0.5, y + 0.3, str(i), ha="center", va="bottom", fontsize=6, color="#555555")
        ax.text(x + 0.5, y + 0.85, str(b), ha="center", va="center", fontsize=7, color=_text_color(color))
        if 0 <= b < state.num_blocks:
            ax.add_patch(
                Rectangle(
                    (b % cols, b // cols),
                    1,
                    1,
                    fill=False,
                    edgecolor=palette.HIGHLIGHT,
                    linewidth=1.8,
                    gid="selected-block",
                )
            )
    bottom = table_height(math.ceil(max(len(blocks), 1) / TABLE_COLUMNS), sharers=False)
    sharers = shared_with(state, selected)
    if sharers:
        names = [name(rid) for rid in sharers]
        names = names[:4] + [f"{len(names) - 4} more"] if len(names) > 5 else names
        ax.text(x0, bottom + 0.2, f"shares blocks with {', '.join(names)}", fontsize=7, va="top", gid="table-sharers")
        bottom += 0.8
    return bottom


def table_height(rows: int, sharers: bool = True) -> float:
    """Where a block table of ``rows`` rows ends (with the line naming its sharers below, when
    ``sharers``)."""
    return 0.35 + TABLE_ROW_PITCH * rows + (0.8 if sharers else 0.0)


def shared_with(state: BlockMapState, request_id: str) -> list[str]:
    """The other requests that hold some block of ``request_id``'s table, in table order."""
    others: dict[str, None] = {}  # an ordered set
    for b in state.tables.get(request_id, []):
        if 0 <= b < state.num_blocks:
            others.update(dict.fromkeys(rid for rid in state.holders[b] if rid != request_id))
    return list(others)


def _draw_gauge(ax, state: BlockMapState, y0: float, width: float) -> None:
    """Used tokens inside allocated tokens inside the pool, on one bar the grid's width; the gap
    between used and allocated is reserved-but-empty space in partly filled last blocks. With
    prefix caching, the free blocks still cached follow the allocated ones, hatched."""
    capacity = state.capacity_tokens or max(state.allocated_tokens, state.used_tokens, 1)
    scale = width / capacity
    for gid, tokens, color in (
        ("gauge-pool", capacity, GAUGE_POOL),
        ("gauge-allocated", state.allocated_tokens, GAUGE_ALLOCATED),
        ("gauge-used", state.used_tokens, GAUGE_USED),
    ):
        ax.add_patch(
            Rectangle(
                (0, y0),
                tokens * scale,
                0.8,
                facecolor=color,
                edgecolor="#666666" if gid == "gauge-pool" else "none",
                linewidth=0.8,
                gid=gid,
            )
        )
    if state.cached_free and state.block_size:
        cached = len(state.cached_free) * state.block_size * scale
        ax.add_patch(
            Rectangle(
                (state.allocated_tokens * scale, y0),
                cached,
                0.8,
                facecolor=CACHED_FREE,
                edgecolor="#9a9a9a",
                hatch=CACHED_HATCH,
                linewidth=0,
                gid="gauge-cached",
            )
        )
    pool = f"pool {state.capacity_tokens} tokens" if state.capacity_tokens else "pool size unknown"
    if state.block_size:
        pool += f" ({state.num_blocks} blocks x {state.block_size})"
    share = f" ({state.used_tokens / state.allocated_tokens:.0%} of allocated)" if state.allocated_tokens else ""
    saved = f"  |  sharing saves {state.saved_tokens}" if state.saved_tokens else ""
    ax.text(
        0,
        y0 + 1.0,
        f"KV tokens: used {state.used_tokens}{share}  |  allocated {state.allocated_tokens}{saved}  |  {pool}",
        fontsize=8,
        va="top",
        gid="gauge-text",
    )


# --- block tables as arrows -------------------------------------------------------------------


def draw_block_tables(
    tables: dict[str, list[int]],
    num_blocks: int,
    block_size: int,
    num_tokens: dict[str, int] | None = None,
    ax=None,
    title: str = "",
    cached_free: list[int] = (),
):
    """One or two requests' block tables as the vLLM paper draws them (Kwon et al., SOSP 2023,
    Fig. 6 and 7): each request's logical blocks in a row, the pool's physical blocks in a row
    between them, an arrow from logical block i to the physical block its table names. The first
    request sits above the pool and the second below, so no arrow crosses another request's row.
    Blocks in neither table draw as free, so pass every request that holds blocks.
    ``num_tokens`` (request id -> tokens stored) writes how full each logical block is. Logical
    cells carry gids ``logical:<rid>:<i>``, physical ones ``physical:<b>``, arrows
    ``arrow:<rid>:<i>`` (their ``xy`` is the physical cell's edge). With prefix caching, a block in
    both tables is drawn shared (both requests' arrows end on it) and ``cached_free`` lists free
    blocks whose hash is still cached (hatched). Returns the Axes."""
    if not 1 <= len(tables) <= 2:
        raise ValueError(f"draw_block_tables draws one or two requests (above and below the pool), got {len(tables)}")
    colors = dict(zip(tables, tab20_shades()))
    holders: dict[int, list[str]] = {}
    for rid, blocks in tables.items():
        for b in blocks:
            holders.setdefault(b, []).append(rid)
    if ax is None:
        _, ax = plt.subplots(figsize=(min(14.0, 1.5 + 0.7 * num_blocks), 3.4 if len(tables) == 2 else 2.3))
    for b in range(num_blocks):  # the pool, row y = 0..1
        held = holders.get(b, [])
        if len(held) > 1:
            fill, owner = shared_color(len(held)), "shared"
        elif held:
            fill, owner = colors[held[0]], held[0]
        else:
            fill, owner = (CACHED_FREE, "cached") if b in cached_free else (FREE, "free")
        hatch = CACHED_HATCH if owner == "cached" else None
        ax.add_patch(Rectangle((b, 0), 1, 1, facecolor=fill, edgecolor="#888888", hatch=hatch, gid=f"physical:{b}"))
        size = 7 if owner in ("shared", "cached") else 8
        ax.text(b + 0.5, 0.5, f"{b}\n{owner}", ha="center", va="center", fontsize=size, color=_text_color(fill))
    ax.text(-0.3, 0.5, "physical\nblocks\n(id, owner)", ha="right", va="center", fontsize=8)
    for row, (rid, blocks) in zip((-2.6, 2.6), tables.items()):  # above the pool, then below it
        color, above = colors[rid], row < 0
        for i, b in enumerate(blocks):
            ax.add_patch(Rectangle((i, row), 1, 1, facecolor=color, edgecolor="white", gid=f"logical:{rid}:{i}"))
            filled = f"\n{min(max(num_tokens[rid] - i * block_size, 0), block_size)}/{block_size}" if num_tokens else ""
            ax.text(i + 0.5, row + 0.5, f"{i}{filled}", ha="center", va="center", fontsize=8, color=_text_color(color))
            ax.annotate(
                "",
                xy=(b + 0.5, 0 if above else 1),
                xytext=(i + 0.5, row + 1 if above else row),
                arrowprops=dict(arrowstyle="->", color=color, lw=1.2, shrinkA=0, shrinkB=2),
                gid=f"arrow:{rid}:{i}",
            )
        ax.text(-0.3, row + 0.5, f"{rid}'s logical\nblocks", ha="right", va="center", fontsize=8)
    ax.set_xlim(-2.2, max(num_blocks, *map(len, tables.values())) + 0.2)
    ax.set_ylim(3.8 if len(tables) == 2 else 1.4, -2.8)
    ax.set_aspect("equal")
    ax.axis("off")
    held = len(holders)
    shared = sum(len(h) > 1 for h in holders.values())
    cached = sum(b not in holders for b in cached_free)
    held_note = f" ({shared} shared)" if shared else ""
    free_note = f" ({cached} still cached)" if cached else ""
    fill_note = " (cells: logical block, tokens filled / slots)" if num_tokens else ""
    ax.set_title(
        title
        or f"block tables: {held} of {num_blocks} physical blocks held{held_note}, "
        f"{num_blocks - held} free{free_note}{fill_note}",
        fontsize=10,
        loc="left",
    )
    return ax


# --- the widget -------------------------------------------------------------------------------


def step_events(trace) -> str:
    """The steps with preemptions or swaps, for the line under the widget."""
    marks = []
    for r in trace:
        kinds = [
            what for what, ids in (("preempt", r.preempted_ids), ("swap", getattr(r, "swapped_out_ids", None))) if ids
        ]
        if kinds:
            marks.append(f"{r.step} ({' + '.join(kinds)})")
    return "steps with preemption or swap: " + (", ".join(marks) if marks else "none")


class BlockMap(FigureView):
    """The block map with a step slider, play, and a request dropdown that picks whose block table
    is drawn."""

    def __init__(self, trace, outputs=None, labels: dict | None = None, selected: str | None = None):
        self.labels = labels
        self.slider = widgets.IntSlider(min=0, max=0, description="step", continuous_update=True)
        self.play = widgets.Play(min=0, max=0, interval=500, description="play")
        widgets.link((self.play, "value"), (self.slider, "value"))
        widgets.link((self.play, "max"), (self.slider, "max"))
        self.request = widgets.Dropdown(description="request", options=[("(none)", None)])
        self.info = widgets.HTML()
        fig = Figure(figsize=(10, 3))
        self.ax = fig.add_subplot()
        super().__init__(fig, [widgets.HBox([self.play, self.slider, self.request])])
        self.widget.children += (self.info,)
        self.set_data(trace, outputs, selected)
        self.slider.observe(lambda change: self.show_step(), names="value")
        self.request.observe(lambda change: self.show_step(), names="value")

    def set_data(self, trace, outputs=None, selected: str | None = None) -> None:
        """Show another run: the dropdown lists the requests in prompt order when ``outputs`` is
        given, else in the order they first hold blocks."""
        self.trace = trace
        self.tables = block_tables_per_step(trace)
        self.cached = cached_free_blocks_per_step(trace)
        self.colors = request_colors(trace)
        ids = [o.request_id for o in outputs] if outputs else []
        ids += [rid for rid in self.colors if rid not in ids]
        name = (lambda rid: self.labels.get(rid, rid)) if self.labels else (lambda rid: rid)
        self.request.options = [("(none)", None)] + [(name(rid), rid) for rid in ids]
        self.request.value = selected if selected in ids else (ids[0] if ids else None)
        self.fig.set_size_inches(*_figsize(pool_size(trace)[0], records_prefix_cache(trace)))
        held = [len(blocks) for tables in self.tables for blocks in tables.values()]
        self.table_rows = math.ceil(max(held, default=1) / TABLE_COLUMNS)  # the longest table of the run
        last = max(len(trace) - 1, 0)
        self.slider.value = min(self.slider.value, last)
        self.slider.max = self.play.max = last
        self.show_step()

    def show_step(self) -> None:
        """Redraw the map at the slider's step for the dropdown's request."""
        self.ax.clear()
        if not len(self.trace):
            self.info.value = "no engine steps"
            self.refresh()
            return
        step = self.slider.value
        self.state = block_map_state(self.trace, step, self.tables, self.cached)
        draw_block_map(
            self.trace, step, self.ax, self.request.value, self.labels, self.colors, self.state, self.table_rows
        )
        self.info.value = f"<pre>{html.escape(step_events(self.trace))}</pre>"
        self.refresh()


def block_map(trace, outputs=None, labels: dict | None = None, selected: str | None = None) -> BlockMap:
    return BlockMap(trace, outputs, labels, selected)
