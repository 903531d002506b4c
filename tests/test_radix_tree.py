"""The radix tree model (``minillm/kv/radix_tree.py``): insert, match, split, evict, locks, and
what it finds against the block hash chain of ``PrefixCachingBlockManager``."""

from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import workloads
from minillm.kv.prefix_cache import PrefixCachingBlockManager
from minillm.kv.radix_tree import (
    RadixTree,
    chained_block_hashes,
    common_prefix_length,
    compare_prefix_hits,
)


def edges(tree):
    """The tree as ``(parent tokens, child tokens)`` pairs, easy to compare."""
    return sorted((parent.tokens, child.tokens) for parent, child in tree.edges())


def test_an_empty_tree_matches_nothing():
    tree = RadixTree()
    assert tree.match_prefix([1, 2, 3]) == 0
    assert tree.num_tokens == 0 and tree.nodes() == [tree.root]


def test_insert_splits_the_edge_where_sequences_part():
    tree = RadixTree()
    first = tree.insert([1, 2, 3, 4, 5])
    assert edges(tree) == [((), (1, 2, 3, 4, 5))]
    second = tree.insert([1, 2, 3, 9])
    assert edges(tree) == [((), (1, 2, 3)), ((1, 2, 3), (4, 5)), ((1, 2, 3), (9,))]
    assert first.tokens == (4, 5) and second.tokens == (9,)  # the first insert's node kept its identity
    assert first.parent is second.parent
    assert tree.num_tokens == 6  # the shared three tokens are stored once


def test_a_sequence_that_ends_inside_an_edge_gets_its_own_node():
    tree = RadixTree()
    tree.insert([1, 2, 3, 4])
    end = tree.insert([1, 2])
    assert end.tokens == (1, 2) and [c.tokens for c in end.children.values()] == [(3, 4)]
    assert tree.insert([1, 2]) is end  # inserting it again changes nothing but the counts
    assert end.num_sequences == 3 and tree.num_tokens == 4


def test_match_counts_tokens_not_blocks():
    tree = RadixTree()
    tree.insert([1, 2, 3, 4, 5, 6])
    tree.insert([1, 2, 7])
    assert tree.match_prefix([1, 2, 3, 4, 5, 6, 8]) == 6
    assert tree.match_prefix([1, 2, 3, 9]) == 3  # part-way along the edge (3, 4, 5, 6)
    assert tree.match_prefix([1, 2, 7, 7]) == 3
    assert tree.match_prefix([2]) == 0
    assert tree.match_prefix([1, 2]) == 2


def test_vllm_docs_example_ten_shared_tokens_two_blocks():
    """vLLM's "Automatic Prefix Caching" example: 4-token blocks, a 14-token prompt whose first 10
    tokens match an earlier request hits 2 blocks (8 tokens); the tree finds all 10."""
    first = list(range(100, 112))
    second = first[:10] + [1, 2, 3, 4]
    [_, hit] = compare_prefix_hits([first, second], block_size=4)
    assert (hit.radix_tokens, hit.hash_chain_tokens, hit.sub_block_tokens) == (10, 8, 2)


def test_evict_takes_the_least_recently_used_leaf_first():
    tree = RadixTree()
    a = tree.insert([1, 2, 3, 4])
    b = tree.insert([1, 2, 5, 6])
    c = tree.insert([7, 8])
    tree.match_prefix([1, 2, 3, 4])  # a is used again: b is now the oldest leaf, then c
    assert tree.evict(1) == [b]
    assert tree.evict(1) == [c]
    assert tree.evict(1) == [a]
    assert tree.evict(1) == [a.parent]  # (1, 2) became a leaf when its children went
    assert tree.nodes() == [tree.root] and tree.evict(1) == []


def test_evict_frees_whole_leaves_until_it_has_enough():
    tree = RadixTree()
    tree.insert([1, 2, 3])
    tree.insert([4, 5, 6, 7, 8])
    evicted = tree.evict(2)
    assert [len(n.tokens) for n in evicted] == [3]  # one leaf of 3 is enough for 2
    assert tree.num_tokens == 5


def test_an_inner_node_is_never_evicted_before_its_children():
    tree = RadixTree()
    tree.insert([1, 2, 3])
    tree.insert([1, 2, 3, 4])  # extends (1, 2, 3): now an inner node, used whenever its child is
    evicted = tree.evict(100)
    assert [n.tokens for n in evicted] == [(4,), (1, 2, 3)]


def test_locked_nodes_are_never_evicted():
    tree = RadixTree()
    held = tree.insert([1, 2, 3, 4])
    other = tree.insert([1, 2, 9])
    tree.lock(held)
    assert held.ref_count == 1 and held.parent.ref_count == 1 and other.ref_count == 0
    assert tree.evict(100) == [other]  # (1, 2) and (3, 4) are held
    assert tree.num_tokens == 4 and tree.match_prefix([1, 2, 3, 4]) == 4
    tree.unlock(held)
    assert tree.evict(100) == [held, held.parent]


def test_a_split_keeps_the_lock_on_both_parts():
    tree = RadixTree()
    held = tree.insert([1, 2, 3, 4])
    tree.lock(held)
    tree.insert([1, 2, 8])  # splits the held edge: the new (1, 2) node is held too
    assert held.parent.tokens == (1, 2) and held.parent.ref_count == 1
    assert [n.tokens for n in tree.evict(100)] == [(8,)]


def test_unlock_without_lock_is_an_error():
    tree = RadixTree()
    node = tree.insert([1, 2])
    try:
        tree.unlock(node)
    except ValueError:
        return
    raise AssertionError("unlock of a node nobody holds must raise")


def test_nodes_list_parents_before_children():
    tree = RadixTree()
    for seq in ([1, 2, 3], [1, 2, 4], [5], [1, 6]):
        tree.insert(seq)
    order = tree.nodes()
    assert order[0] is tree.root
    assert all(order.index(parent) < order.index(child) for parent, child in tree.edges())
    assert len(tree.edges()) == len(order) - 1


def test_chained_hashes_match_the_block_manager():
    """The comparison's hash chain is the engine's: a sequence cached in a
    ``PrefixCachingBlockManager`` is found exactly where ``chained_block_hashes`` says."""
    bm = PrefixCachingBlockManager(num_blocks=8, block_size=4)
    tokens = list(range(10))
    hashes = chained_block_hashes(tokens, 4)
    assert len(hashes) == 2  # the last 2 tokens do not fill a block
    for i, h in enumerate(hashes):
        bm.cached_block_ids[h] = i
    assert bm.find_cached_blocks(tokens[:8] + [99]) == [0, 1]


def test_shared_system_prompt_shows_sub_block_tokens():
    w = workloads.shared_prefix(
        5, prefix_len=20, suffix_lens=workloads.uniform(3, 9), output_lens=workloads.uniform(1, 2)
    )
    hits = compare_prefix_hits(w, block_size=8)
    assert hits[0].radix_tokens == 0
    assert all(h.radix_tokens >= 20 for h in hits[1:])  # the whole system prompt, to the token
    assert all(h.hash_chain_tokens == 16 for h in hits[1:])  # two whole blocks of it; 4 tokens missed
    assert sum(h.radix_tokens for h in hits) == workloads.repeated_tokens(w)


prompt_sets = st.lists(st.lists(st.integers(0, 3), max_size=14), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(prompts=prompt_sets, query=st.lists(st.integers(0, 3), max_size=14))
def test_match_is_the_longest_common_prefix_with_any_inserted_sequence(prompts, query):
    """Over a small alphabet, so sequences share and split edges often."""
    tree = RadixTree()
    for p in prompts:
        tree.insert(p)
    assert tree.match_prefix(query) == max(common_prefix_length(p, query) for p in prompts)
    assert tree.num_tokens == sum(len(n.tokens) for n in tree.nodes())
    assert all(len(n.tokens) > 0 for n in tree.nodes()[1:])  # no empty edges
    assert all(key == child.tokens[0] for n in tree.nodes() for key, child in n.children.items())


@settings(max_examples=200, deadline=None)
@given(prompts=prompt_sets, block_size=st.integers(1, 5))
def test_hash_chain_is_the_radix_match_rounded_down_to_whole_blocks(prompts, block_size):
    """When every earlier prompt was cached whole and nothing was evicted, the hash chain finds
    exactly ``block_size * (radix_tokens // block_size)`` tokens of each prompt: block i of a prompt
    is cached iff an earlier prompt has the same first ``(i + 1) * block_size`` tokens, and the
    longest such earlier prefix is the tree's match."""
    for h in compare_prefix_hits(prompts, block_size):
        assert h.hash_chain_tokens == block_size * (h.radix_tokens // block_size)
        assert 0 <= h.sub_block_tokens < block_size
        assert h.radix_tokens <= h.prompt_len
