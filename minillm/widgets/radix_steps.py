"""Chapter 7's radix tree over time, one event per slider position: a request arrives (its prompt is
inserted; it holds its path while it runs), finishes (its path stays cached, no longer held), or
memory runs short (least recently used leaves are evicted, a branch from its tip toward the root).

    from minillm.widgets import radix_tree_steps
    radix_tree_steps([("arrive", "A", prompt_a), ("arrive", "B", prompt_b), ("finish", "A"), ("evict", 8)])

Each picture is ``draw_radix_tree`` of minillm's ``RadixTree`` after the events so far, captioned
with what the last one did: the tokens found, an edge split, the nodes evicted.
"""

from __future__ import annotations

from minillm.kv.radix_tree import RadixNode, RadixTree
from minillm.widgets.figure_view import EventSteps
from minillm.widgets.prefix_cache import draw_radix_tree

EVENTS = ("arrive", "finish", "evict")


def check_events(events) -> None:
    """Each event is ``("arrive", name, token_ids)``, ``("finish", name)`` or ``("evict", num_tokens)``;
    a request finishes only after it arrived, and once."""
    running = set()
    for i, event in enumerate(events):
        kind = event[0] if event else None
        if kind not in EVENTS:
            raise ValueError(f"events[{i}] must start with one of {EVENTS}, got {event!r}")
        if kind == "arrive":
            running.add(event[1])
        elif kind == "finish":
            if event[1] not in running:
                raise ValueError(f"events[{i}] finishes {event[1]!r}, which is not running")
            running.discard(event[1])


def replay(events, upto: int) -> tuple[RadixTree, dict[RadixNode, str], str]:
    """The tree after the first ``upto`` events, the names of the requests ending at each node, and
    a sentence on what event ``upto`` did (``""`` for none)."""
    tree, ends, caption = RadixTree(), {}, ""
    for kind, *args in events[:upto]:
        if kind == "arrive":
            name, tokens = args
            found, before = tree.match_prefix(tokens), len(tree.nodes())
            node = tree.insert(tokens)
            tree.lock(node)
            ends[name] = node
            added = len(tree.nodes()) - before
            how = {0: "the whole prompt was there already", 1: "a new edge holds the rest"}.get(
                added, "an edge split where the prompts part ways, and a new edge holds the rest"
            )
            caption = f"{name} arrives: {found} of its {len(tokens)} tokens found; {how}. It holds its path (outlined)."
        elif kind == "finish":
            tree.unlock(ends[args[0]])
            caption = f"{args[0]} finishes: its tokens stay cached, no longer held: free to evict."
        else:
            evicted = tree.evict(args[0])
            gone = [name for name, node in ends.items() if node in evicted]
            ends = {name: node for name, node in ends.items() if node not in evicted}
            caption = (
                f"Memory is short: {sum(len(n.tokens) for n in evicted)} tokens evicted, least recently used leaf "
                f"first ({len(evicted)} node{'s' if len(evicted) != 1 else ''}"
                + (f": the end of {', '.join(gone)}" if gone else "")
                + "); held nodes stay."
                if evicted
                else "Memory is short, but every leaf is held by a running request: nothing can be evicted."
            )
    labels: dict[RadixNode, str] = {}
    for name, node in ends.items():
        labels[node] = f"{labels[node]}, {name}" if node in labels else name
    return tree, labels, caption


class RadixSteps(EventSteps):
    """A slider over the events: the tree after each, and what that event did. It opens where the
    tree has the most nodes."""

    def __init__(self, events, title: str = ""):
        check_events(events)
        self.events, self.title = list(events), title
        sizes = [len(replay(self.events, k)[0].nodes()) for k in range(len(self.events) + 1)]
        super().__init__(len(self.events), sizes.index(max(sizes)), figsize=(9, 3.6))

    def draw(self, step: int) -> str:
        tree, labels, caption = replay(self.events, step)
        title = self.title or f"the radix tree after {step} of {len(self.events)} events"
        draw_radix_tree(tree, self.ax, labels, title=title)
        return caption or "Before any request: an empty tree."


def radix_tree_steps(events, title: str = "") -> RadixSteps:
    return RadixSteps(events, title)
