"""Chapter 7's free block queue, step by step: the picture vLLM's prefix-caching design document draws
as a worked example, here driven through minillm's ``PrefixCachingBlockManager``.

    from minillm.widgets import free_queue_steps
    free_queue_steps([("arrive", "A", prompt_a), ("finish", "A"), ("arrive", "B", prompt_b)], num_blocks=10)

Each event is a request arriving (its prompt looked up, cached blocks shared, the rest taken from the
queue's head: a named block taken there is evicted) or finishing (its blocks join the queue's tail,
last block first, still named). The picture: the free queue from head (next to be taken) to tail,
named blocks marked with their hash, and the blocks each running request holds.
"""

from __future__ import annotations

from matplotlib.patches import Rectangle

from minillm.kv.prefix_cache import PrefixCachingBlockManager
from minillm.request import Request
from minillm.sampling_params import SamplingParams
from minillm.widgets.block_map import tab20_shades
from minillm.widgets.figure_view import EventSteps
from minillm.widgets.prefix_cache import short_hash

NAMED = "#cfe8dc"  # a free block that still has its name: findable until the queue's head reaches it
BLANK = "#ffffff"


def check_events(events) -> None:
    """``("arrive", name, token_ids)`` or ``("finish", name)``; a request finishes once, after it arrived."""
    running = set()
    for i, event in enumerate(events):
        if not event or event[0] not in ("arrive", "finish"):
            raise ValueError(f"events[{i}] must be ('arrive', name, token_ids) or ('finish', name), got {event!r}")
        if event[0] == "arrive":
            running.add(event[1])
        elif event[1] not in running:
            raise ValueError(f"events[{i}] finishes {event[1]!r}, which is not running")
        else:
            running.discard(event[1])


def replay(events, upto: int, num_blocks: int, block_size: int):
    """The block manager after the first ``upto`` events, and a sentence on what event ``upto`` did.
    A request's prefill is taken as done at once: its full blocks are named as it arrives."""
    bm, requests, caption = PrefixCachingBlockManager(num_blocks, block_size), {}, ""
    for kind, name, *tokens in events[:upto]:
        if kind == "finish":
            bm.free(requests.pop(name))
            caption = f"{name} finishes: its blocks join the queue's tail, last block first, still named."
            continue
        request = Request(name, list(tokens[0]), SamplingParams(max_tokens=1), arrival_time=0.0)
        found = bm.find_cached_blocks(request.prompt_token_ids)
        bm.share_cached_blocks(name, found)
        request.num_computed_tokens = len(found) * block_size
        named_before = set(bm.cached_block_ids.values())
        if not bm.allocate_slots(request, request.num_tokens - request.num_computed_tokens):
            raise ValueError(f"{name}'s {request.num_tokens} tokens do not fit in {num_blocks} blocks")
        taken = bm.get_block_table(name)[len(found) :]
        evicted = [b for b in taken if b in named_before]
        request.num_computed_tokens = request.num_tokens  # its prefill, done
        bm.cache_full_blocks(request)
        requests[name] = request
        caption = (
            f"{name} arrives: {len(found)} block{'s' if len(found) != 1 else ''} found cached and shared; "
            f"{len(taken)} taken from the queue's head"
            + (f", evicting the names of {len(evicted)}" if evicted else "")
            + "."
        )
    return bm, caption


def draw_free_queue(bm: PrefixCachingBlockManager, ax, title: str = ""):
    """The free queue, head to tail (named blocks shaded, with their hash), and each running
    request's block table below it. Returns the Axes."""
    queue = list(bm.free_block_ids)
    ax.text(-0.2, 0.5, "free queue\n(head)", ha="right", va="center", fontsize=8)
    for x, block in enumerate(queue):
        name = bm.block_hashes[block]
        ax.add_patch(
            Rectangle(
                (x, 0), 1, 1, facecolor=NAMED if name is not None else BLANK, edgecolor="#555555", gid=f"free:{block}"
            )
        )
        ax.text(x + 0.5, 0.35, str(block), ha="center", va="center", fontsize=9)
        if name is not None:
            ax.text(x + 0.5, 0.75, short_hash(name), ha="center", va="center", fontsize=6, color="#333333")
    ax.text(len(queue) + 0.2, 0.5, "(tail)", va="center", fontsize=8)
    shades = tab20_shades()
    held = [(rid, table) for rid, table in bm.block_tables.items() if table]
    for row, (rid, table) in enumerate(held, start=1):
        y = 1.6 * row
        ax.text(-0.2, y + 0.5, f"held by {rid}", ha="right", va="center", fontsize=8)
        for x, block in enumerate(table):
            shared = bm.ref_counts[block] > 1
            ax.add_patch(
                Rectangle(
                    (x, y),
                    1,
                    1,
                    facecolor=shades[(row - 1) % len(shades)],
                    edgecolor="#555555",
                    linewidth=2.2 if shared else 0.8,
                    gid=f"held:{rid}:{block}",
                )
            )
            ax.text(x + 0.5, y + 0.5, str(block), ha="center", va="center", fontsize=9)
    ax.set_xlim(-2.2, max(bm.num_blocks, 1) + 1.2)
    ax.set_ylim(1.6 * max(len(held), 1) + 1.3, -0.4)
    ax.axis("off")
    ax.set_title(
        title or "free queue (shaded: still named, findable) and the blocks each request holds (thick: shared)",
        fontsize=9,
        loc="left",
    )
    return ax


class FreeQueueSteps(EventSteps):
    """A slider over the events: the free queue and the held blocks after each. It opens where the
    queue holds the most named blocks."""

    def __init__(self, events, num_blocks: int, block_size: int, title: str = ""):
        check_events(events)
        self.events, self.num_blocks, self.block_size, self.title = list(events), num_blocks, block_size, title
        named = [
            sum(bm.block_hashes[b] is not None for b in bm.free_block_ids)
            for bm, _ in (replay(self.events, k, num_blocks, block_size) for k in range(len(self.events) + 1))
        ]
        super().__init__(len(self.events), named.index(max(named)), figsize=(9, 3.2))

    def draw(self, step: int) -> str:
        bm, caption = replay(self.events, step, self.num_blocks, self.block_size)
        draw_free_queue(bm, self.ax, self.title)
        return caption or "Before any request: every block free, none named."


def free_queue_steps(events, num_blocks: int = 10, block_size: int = 4, title: str = "") -> FreeQueueSteps:
    return FreeQueueSteps(events, num_blocks, block_size, title)
