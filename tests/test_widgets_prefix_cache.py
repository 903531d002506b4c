"""The prefix-caching drawings, tested as state: which boxes and nodes are drawn, their labels and
colours (``minillm/widgets/prefix_cache.py``), not pixels."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from minillm import workloads  # noqa: E402
from minillm.kv.radix_tree import RadixTree, chained_block_hashes  # noqa: E402
from minillm.widgets import draw_hash_chain, draw_radix_tree, hash_chain_rows  # noqa: E402
from minillm.widgets.prefix_cache import ALONE, PARTIAL, SHARED_NODE, short_hash  # noqa: E402

SYSTEM = list(range(100, 110))  # a 10-token system prompt: 2 full blocks of 4 and 2 tokens more
PROMPTS = [SYSTEM + [1, 2, 3], SYSTEM + [7, 7], [5, 5, 5, 5, 5]]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def patches(ax, prefix):
    return {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith(prefix)}


def texts(ax):
    return [t.get_text() for t in ax.texts]


def test_rows_hold_every_block_and_mark_hits_and_partials():
    rows = hash_chain_rows(PROMPTS, block_size=4)
    assert [len(r) for r in rows] == [4, 3, 2]  # 13 tokens: 3 full + 1; 12: 3 full; 5: 1 full + 1
    assert [b.hit for b in rows[1]] == [True, True, False]  # the third block holds 2 system tokens + 7, 7
    assert rows[0][-1].hash is None and rows[0][-1].num_tokens == 1
    assert [b.num_prompts for b in rows[0][:3]] == [2, 2, 1]
    assert not any(b.hit for b in rows[0] + rows[2])


def test_hash_chain_draws_a_box_per_block_and_an_arrow_per_chained_block():
    ax = draw_hash_chain(PROMPTS, block_size=4)
    boxes = patches(ax, "block:")
    assert len(boxes) == 4 + 3 + 2
    arrows = [a for a in ax.texts if (a.get_gid() or "").startswith("chain:")]
    assert len(arrows) == (3 - 1) + (3 - 1) + (1 - 1)  # each full block but the first points to its parent
    first_hashes = chained_block_hashes(PROMPTS[0], 4)
    assert all(short_hash(h) in texts(ax) for h in first_hashes)
    assert "1/4\nno hash" in texts(ax)


def test_shared_blocks_share_a_colour_and_others_stay_pale():
    ax = draw_hash_chain(PROMPTS, block_size=4)
    color = {gid: to_hex(p.get_facecolor()) for gid, p in patches(ax, "block:").items()}
    assert color["block:0:0"] == color["block:1:0"] and color["block:0:1"] == color["block:1:1"]
    assert color["block:0:0"] != color["block:0:1"]  # two shared blocks, two colours
    assert color["block:0:2"] == color["block:1:2"] == color["block:2:0"] == ALONE
    assert color["block:0:3"] == color["block:2:1"] == PARTIAL
    assert patches(ax, "block:")["block:0:3"].get_linestyle() == "--"


def test_hash_chain_writes_the_cached_tokens_of_each_row():
    ax = draw_hash_chain(PROMPTS, block_size=4, labels=["sys A", "sys B", "other"])
    hits = {t.get_gid(): t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("hits:")}
    assert hits == {"hits:0": "cached: 0", "hits:1": "cached: 8", "hits:2": "cached: 0"}
    assert "sys B (12 tok)" in texts(ax)


def test_radix_tree_draws_a_node_per_tree_node_and_shares_the_system_prompt():
    ax = draw_radix_tree(PROMPTS)
    nodes = patches(ax, "node:")
    assert len(nodes) == 4  # the system prompt, its two continuations, the other prompt
    shared = [gid for gid, p in nodes.items() if to_hex(p.get_facecolor()) == SHARED_NODE]
    assert len(shared) == 1
    assert "+10 tok\n×2" in texts(ax) and "+5 tok\n×1" in texts(ax)
    ends = sorted(t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("ends:"))
    assert ends == ["R0", "R1", "R2"]
    assert len([line for line in ax.lines if (line.get_gid() or "").startswith("edge:")]) == 4


def test_radix_tree_of_a_chat_is_a_chain_per_conversation():
    w = workloads.multi_turn(2, 3, workloads.uniform(4, 8), workloads.uniform(2, 4))
    ax = draw_radix_tree(w.prompts)
    assert len(patches(ax, "node:")) == 6  # each turn extends the one before: one node per turn
    ends = [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("ends:")]
    assert sorted(ends) == [f"R{i}" for i in range(6)]


def test_radix_tree_from_a_tree_outlines_held_nodes_and_takes_node_labels():
    tree = RadixTree()
    held = tree.insert(PROMPTS[0])
    tree.insert(PROMPTS[1])
    tree.lock(held)
    ax = draw_radix_tree(tree, labels={held: "running"})
    nodes = patches(ax, "node:")
    assert nodes[f"node:{held.id}"].get_linewidth() > nodes[f"node:{tree.nodes()[-1].id}"].get_linewidth()
    assert "+3 tok\n×1, ref 1" in texts(ax)
    assert [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("ends:")] == ["running"]


# --- the radix tree over time -----------------------------------------------------------------------

SYSTEM = list(range(100, 108))  # 8 tokens every request starts with
EVENTS = [
    ("arrive", "A", SYSTEM + [1, 2, 3]),
    ("arrive", "B", SYSTEM + [7, 8]),  # parts ways with A after the system prompt: A's edge splits
    ("finish", "A"),
    ("evict", 2),  # the least recently used leaf no request holds: A's own three tokens
]


def test_replaying_the_events_splits_an_edge_and_evicts_the_free_leaf_only():
    from minillm.widgets.radix_steps import replay

    tree, labels, caption = replay(EVENTS, 2)
    assert "8 of its 10 tokens found" in caption and "split" in caption
    assert sorted(len(n.tokens) for n in tree.nodes()[1:]) == [2, 3, 8]  # the shared system prompt, then each own tail
    tree, labels, caption = replay(EVENTS, 3)
    assert "A finishes" in caption and all(n.ref_count == 0 for n in tree.nodes() if labels.get(n) == "A")
    tree, labels, caption = replay(EVENTS, 4)
    assert "3 tokens evicted" in caption and "the end of A" in caption
    assert sorted(labels.values()) == ["B"] and tree.num_tokens == 8 + 2  # B, still held, and the prefix it holds


def test_the_steps_widget_redraws_at_each_event_and_refuses_a_finish_before_an_arrival():
    from minillm.widgets import radix_tree_steps

    view = radix_tree_steps(EVENTS)
    assert view.slider.max == len(EVENTS) and view.slider.value == 2  # it starts where the tree is largest
    view.slider.value = len(EVENTS)
    assert "evicted" in view.caption.value
    last = view.static_png()
    view.slider.value = 0
    assert "empty tree" in view.caption.value and view.static_png() != last
    with pytest.raises(ValueError, match=r"events\[0\] finishes 'Z'"):
        radix_tree_steps([("finish", "Z")])


# --- the free block queue over time ---------------------------------------------------------------

A = list(range(1, 11))  # 10 tokens: two full blocks of 4 (named) and a partial one
QUEUE_EVENTS = [
    ("arrive", "A", A),
    ("arrive", "B", A[:8] + [50, 51, 52, 53, 54, 55]),  # shares A's two full blocks
    ("finish", "A"),
    ("finish", "B"),
    ("arrive", "C", list(range(100, 124))),  # six new blocks from the head: none of them named
    ("arrive", "D", A),  # A's prompt again: its two blocks found in the queue, taken from its middle
    ("arrive", "E", [200, 201, 202, 203]),  # the head is B's named block: its name is evicted
]


def test_the_free_queue_takes_from_its_head_returns_to_its_tail_and_shares_from_its_middle():
    from minillm.widgets.free_queue import replay

    bm, caption = replay(QUEUE_EVENTS, 2, 10, 4)
    assert "2 blocks found cached" in caption and bm.get_block_table("B")[:2] == bm.get_block_table("A")[:2]
    bm, caption = replay(QUEUE_EVENTS, 4, 10, 4)
    assert list(bm.free_block_ids) == [5, 6, 7, 8, 9, 2, 4, 3, 1, 0]  # each request's blocks freed last first
    assert [b for b in bm.free_block_ids if bm.block_hashes[b] is not None] == [3, 1, 0]
    bm, caption = replay(QUEUE_EVENTS, 6, 10, 4)
    assert bm.get_block_table("D")[:2] == [0, 1] and list(bm.free_block_ids) == [3]
    bm, caption = replay(QUEUE_EVENTS, 7, 10, 4)
    assert "evicting the names of 1" in caption and 3 in bm.get_block_table("E")


def test_the_free_queue_widget_starts_where_most_named_blocks_wait_and_redraws():
    from minillm.widgets import free_queue_steps

    view = free_queue_steps(QUEUE_EVENTS)
    assert view.slider.value == 4  # after both finish: three named blocks wait in the queue
    picture = view.static_png()
    view.slider.value = 7
    assert "evicting" in view.caption.value and view.static_png() != picture
    with pytest.raises(ValueError, match=r"events\[0\] finishes 'Z'"):
        free_queue_steps([("finish", "Z")])
    with pytest.raises(ValueError, match="B's 24 tokens do not fit in 10 blocks"):
        free_queue_steps([("arrive", "A", list(range(24))), ("arrive", "B", list(range(50, 74)))], num_blocks=10)
