"""Prefix caching drawn two ways: vLLM's chain of block hashes, SGLang's radix tree.

    from minillm.widgets import draw_hash_chain, draw_radix_tree
    draw_hash_chain(w.prompts[:4], block_size=16)   # each prompt's blocks, named by a chained hash
    draw_radix_tree(w.prompts[:6])                  # the same prompts stored as one radix tree
    hash_chain_rows(w.prompts[:4], block_size=16)   # the first picture as data

The hash chain names only full blocks, so a shared prefix that ends inside a block is found only up
to the block before it; the tree finds it to the token (``minillm.kv.radix_tree`` says more).
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from minillm.kv.radix_tree import RadixNode, RadixTree, chained_block_hashes
from minillm.widgets.block_map import tab20_shades

ALONE = "#f2f2f2"  # a block or node that only one prompt holds
PARTIAL = "#ffffff"  # a prompt's last, partly filled block: never named, never cached
SHARED_NODE = "#009e73"  # a radix node that two or more prompts run through (Okabe-Ito green)
HELD = "#000000"  # outline of a radix node a running request holds (reference count > 0)
LABEL_GROUND = dict(facecolor="white", edgecolor="none", pad=1)


def _text_color(color: str) -> str:
    r, g, b = to_rgb(color)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def short_hash(block_hash: int) -> str:
    """The last 4 hex digits of a block hash: enough to tell a handful of blocks apart."""
    return f"#{block_hash & 0xFFFF:04x}"


# --- the hash chain ---------------------------------------------------------------------------


@dataclass
class ChainBlock:
    """One block of one prompt, as the hash chain sees it."""

    index: int  # block i of its prompt: tokens i * block_size onwards
    num_tokens: int  # block_size, or fewer for the last, partial block
    hash: int | None  # None for a partial block: it is never named, so never cached
    hit: bool  # an earlier prompt (a row above) already cached this block
    num_prompts: int  # how many of the drawn prompts hold this block


def hash_chain_rows(prompts, block_size: int) -> list[list[ChainBlock]]:
    """Every prompt's blocks, in order. A block is a hit when a prompt above named the same hash;
    the chain makes that a prefix of the row: a block's hash covers every token before it."""
    hashes = [chained_block_hashes(p, block_size) for p in prompts]
    holders: dict[int, int] = {}
    for row in hashes:
        for h in set(row):
            holders[h] = holders.get(h, 0) + 1
    rows, seen = [], set()
    for prompt, row in zip(prompts, hashes):
        blocks = [ChainBlock(i, block_size, h, h in seen, holders[h]) for i, h in enumerate(row)]
        if len(prompt) % block_size:
            blocks.append(ChainBlock(len(row), len(prompt) % block_size, None, False, 1))
        rows.append(blocks)
        seen.update(row)
    return rows


def shared_block_colors(rows: list[list[ChainBlock]]) -> dict[int, str]:
    """A colour per hash that two or more prompts hold, in order of first appearance (tab20's
    shades, repeating past 20 shared blocks); blocks held by one prompt stay pale."""
    colors: dict[int, str] = {}
    shades = tab20_shades()
    for row in rows:
        for block in row:
            if block.num_prompts > 1 and block.hash not in colors:
                colors[block.hash] = shades[len(colors) % len(shades)]
    return colors


def draw_hash_chain(prompts, block_size: int, ax=None, labels=None, title: str = ""):
    """A few prompts' blocks as rows of boxes, as vLLM's prefix cache names them: each full block
    labelled with its hash's last hex digits, an arrow to the parent block its hash is chained to,
    one colour per block that several prompts share, the partial last block dashed (never cached).
    Right of each row: the tokens its hits save. ``labels`` names the rows (default R0, R1, ...).
    Boxes carry gids ``block:<row>:<i>``, arrows ``chain:<row>:<i>`` (block i -> block i - 1).
    Returns the Axes."""
    rows = hash_chain_rows(prompts, block_size)
    colors = shared_block_colors(rows)
    labels = list(labels) if labels is not None else [f"R{i}" for i in range(len(prompts))]
    width = max((len(r) for r in rows), default=1)
    if ax is None:
        _, ax = plt.subplots(figsize=(min(16.0, 2.5 + 0.75 * width), 0.8 + 0.6 * len(rows)))
    step = 1.4  # a box and the gap its arrow crosses
    for r, (row, prompt) in enumerate(zip(rows, prompts)):
        y = 1.5 * r
        for block in row:
            x = block.index * step
            fill = PARTIAL if block.hash is None else colors.get(block.hash, ALONE)
            ax.add_patch(
                Rectangle(
                    (x, y),
                    1,
                    1,
                    facecolor=fill,
                    edgecolor="#555555",
                    linestyle="--" if block.hash is None else "-",
                    lw=1.8 if block.hit else 0.8,
                    gid=f"block:{r}:{block.index}",
                )
            )
            text = f"{block.num_tokens}/{block_size}\nno hash" if block.hash is None else short_hash(block.hash)
            ax.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=7, color=_text_color(fill))
            if block.index > 0 and block.hash is not None:
                ax.annotate(
                    "",
                    xy=(x - step + 1, y + 0.5),
                    xytext=(x, y + 0.5),
                    arrowprops=dict(arrowstyle="->", color="#555555", lw=1, shrinkA=0, shrinkB=0),
                    gid=f"chain:{r}:{block.index}",
                )
        hit_tokens = block_size * sum(b.hit for b in row)
        ax.text(-0.3, y + 0.5, f"{labels[r]} ({len(prompt)} tok)", ha="right", va="center", fontsize=8)
        ax.text(width * step, y + 0.5, f"cached: {hit_tokens}", va="center", fontsize=8, gid=f"hits:{r}")
    legend = [
        Patch(facecolor=tab20_shades()[0], edgecolor="#555555", label="shared block (same colour: same hash)"),
        Patch(facecolor=ALONE, edgecolor="#555555", label="one prompt's block"),
        Patch(facecolor=PARTIAL, edgecolor="#555555", linestyle="--", label="partial block: never cached"),
    ]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(0, 0), ncol=3, fontsize=8, frameon=False)
    ax.set_xlim(-3.2, width * step + 1.6)
    ax.set_ylim(1.5 * len(rows) - 0.3, -0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(
        title
        or f"block hashes, {block_size} tokens a block: a block's hash covers its parent's (<-); "
        "thick outline: cached by a row above",
        fontsize=10,
        loc="left",
    )
    return ax


# --- the radix tree ---------------------------------------------------------------------------


def radix_layout(tree: RadixTree) -> dict[RadixNode, tuple[float, float]]:
    """Where each node sits: x is its depth in nodes (root 0), y its rank among the leaves, an
    inner node halfway between its first and last child, so shared prefixes sit left of where
    prompts part."""
    places: dict[RadixNode, tuple[float, float]] = {}
    next_leaf = 0

    def place(node, depth):
        nonlocal next_leaf
        if node.is_leaf:
            y = next_leaf
            next_leaf += 1
        else:
            ys = [place(child, depth + 1) for child in node.children.values()]
            y = (ys[0] + ys[-1]) / 2
        places[node] = (depth, y)
        return y

    place(tree.root, 0)
    return places


def draw_radix_tree(tree_or_prompts, ax=None, labels=None, title: str = ""):
    """A radix tree as SGLang's RadixAttention keeps it, root on the left: a box per node with the
    number of tokens on the edge into it and how many prompts run through it (green when more
    than one: a prefix stored once and shared); a black outline where a running request holds it.

    Pass prompts (token id lists, inserted in order: ``labels`` names them, default R0, R1, ...,
    written where each ends) or a ``RadixTree`` (``labels``: an optional ``{node: name}``, e.g.
    the nodes ``insert`` returned). Nodes carry gids ``node:<id>``, edges ``edge:<parent>:<child>``.
    Returns the Axes."""
    if isinstance(tree_or_prompts, RadixTree):
        tree, ends = tree_or_prompts, {node: [name] for node, name in (labels or {}).items()}
    else:
        tree, ends = RadixTree(), {}
        names = list(labels) if labels is not None else [f"R{i}" for i in range(len(tree_or_prompts))]
        for name, prompt in zip(names, tree_or_prompts):
            ends.setdefault(tree.insert(prompt), []).append(name)
    places = radix_layout(tree)
    depth = max(x for x, _ in places.values())
    num_leaves = max(y for _, y in places.values()) + 1
    if ax is None:
        _, ax = plt.subplots(figsize=(min(16.0, 2.0 + 2.2 * depth), 0.8 + 0.55 * num_leaves))
    dx, box_w, box_h = 2.4, 1.5, 0.7
    for parent, child in tree.edges():
        (px, py), (cx, cy) = places[parent], places[child]
        start = px * dx + (box_w if parent is not tree.root else 0)
        ax.plot([start, cx * dx], [py, cy], color="#888888", lw=1, zorder=1, gid=f"edge:{parent.id}:{child.id}")
    ax.plot(0, places[tree.root][1], "o", color="black", markersize=7, gid="root")
    ax.text(-0.2, places[tree.root][1], "root", ha="right", va="center", fontsize=8)
    for node in tree.nodes()[1:]:
        x, y = places[node][0] * dx, places[node][1]
        fill = SHARED_NODE if node.num_sequences > 1 else ALONE
        ax.add_patch(
            FancyBboxPatch(
                (x, y - box_h / 2),
                box_w,
                box_h,
                boxstyle="round,pad=0.02",
                facecolor=fill,
                edgecolor=HELD if node.ref_count else "#888888",
                lw=2.2 if node.ref_count else 0.8,
                zorder=2,
                gid=f"node:{node.id}",
            )
        )
        held = f", ref {node.ref_count}" if node.ref_count else ""
        text = f"+{len(node.tokens)} tok\n×{node.num_sequences}{held}"
        ax.text(x + box_w / 2, y, text, ha="center", va="center", fontsize=7, color=_text_color(fill), zorder=3)
        if node in ends:
            name = ", ".join(ends[node])  # on a white ground: the edge to a child runs behind it
            ax.text(
                x + box_w + 0.1, y, name, va="center", fontsize=8, zorder=3, gid=f"ends:{node.id}", bbox=LABEL_GROUND
            )
    ax.set_xlim(-1.0, depth * dx + box_w + 1.2)
    ax.set_ylim(num_leaves - 0.4, -0.6)
    ax.axis("off")
    shared = sum(len(n.tokens) * (n.num_sequences - 1) for n in tree.nodes())
    ax.set_title(
        title
        or f"radix tree: {tree.num_tokens} tokens stored, {shared} more found again "
        "(box: tokens on its edge, ×prompts through it)",
        fontsize=10,
        loc="left",
    )
    return ax


# --- what the cache saved ---------------------------------------------------------------------
def draw_cache_gains(rows: dict, title: str = ""):
    """TTFT with the prefix cache off and on, one pair of bars per workload (``rows``: ``{workload:
    {"off": seconds, "on": seconds, "hit_rate": share}}``), each "on" bar labelled with its hit rate
    and speed-up. Bars carry gids ``ttft-<workload>-off`` / ``-on``. Returns the Figure."""
    names = list(rows)
    fig = Figure(figsize=(9, 0.8 * len(names) + 1.4))
    ax = fig.subplots()
    for y, name in enumerate(names):
        row = rows[name]
        ax.barh(y - 0.2, row["off"] * 1e3, height=0.38, color="#c8c8c8", gid=f"ttft-{name}-off")
        ax.barh(y + 0.2, row["on"] * 1e3, height=0.38, color=SHARED_NODE, gid=f"ttft-{name}-on")
        speedup = row["off"] / row["on"] if row["on"] else float("inf")
        ax.text(row["on"] * 1e3, y + 0.2, f"  {row['hit_rate']:.0%} cached, {speedup:.1f}×", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.35 * max(max(r["off"], r["on"]) for r in rows.values()) * 1e3)
    ax.set_xlabel("TTFT p50 (ms)")
    ax.legend(
        handles=[Patch(facecolor="#c8c8c8", label="cache off"), Patch(facecolor=SHARED_NODE, label="cache on")],
        fontsize=8,
        frameon=False,
        loc="lower right",
    )
    ax.set_title(title, fontsize=9, loc="left")
    fig.tight_layout()
    return fig
