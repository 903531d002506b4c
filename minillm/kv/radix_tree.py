"""A radix tree of token sequences: SGLang's RadixAttention idea, as a model that counts tokens.

``prefix_cache.py`` finds earlier work the way vLLM does: each full block is named by a hash
chained over the blocks before it, and a lookup walks a prompt's blocks until the first miss.
SGLang keeps the same knowledge as a tree instead. Every sequence it has computed is a path from the
root; an edge holds a run of tokens, and a node is where two sequences part ways (a compressed
trie: a chain of single-child nodes is one edge). A new prompt walks down from the root for as long
as its tokens agree, so the match is counted in tokens, not in whole blocks.

What the sources say each design does:

* SGLang (Zheng et al. 2024, "SGLang: Efficient Execution of Structured Language Model Programs"):
  RadixAttention keeps the KV cache of all requests in a radix tree managed as an LRU cache, so KV is
  reused automatically across generation calls. The paper pairs the tree with leaf-first LRU eviction
  and a reference count that protects the nodes used by running requests. SGLang's docs
  ("Radix Cache Eviction Policies") add: eviction only considers leaves that no running request
  holds; the root is never evicted; once a leaf goes, its parent may become a leaf, so eviction
  walks a branch from its tip toward the root. SGLang's radix cache compares keys token by token at
  page size 1, and page by page for larger pages.
* vLLM (docs, "Automatic Prefix Caching"): each KV block is hashed from its parent block's hash, the
  block's tokens and any extra keys (LoRA ids, image hashes, a cache salt); only full blocks are
  cached; a finished request's blocks join the tail of a free queue in reverse order (its last
  block, which hashes the most tokens, is evicted first), and the block at the head is evicted
  (LRU) when a new block is needed. Its worked example: with 4-token blocks, a 14-token prompt
  whose first 10 tokens match an earlier request hits only 2 blocks (8 tokens), because the third
  block matches just 2 of its 4 tokens.

This module holds no KV tensors: a node only counts tokens, so a notebook can compare the two
designs on a workload (``compare_prefix_hits``) and draw the tree (``minillm.widgets``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minillm.kv.prefix_cache import hash_block


@dataclass(eq=False)
class RadixNode:
    """One node: the edge into it holds ``tokens``; its children are keyed by their first token, so
    at most one child can continue any given sequence."""

    tokens: tuple[int, ...]
    parent: RadixNode | None
    id: int
    children: dict[int, RadixNode] = field(default_factory=dict)
    ref_count: int = 0  # running requests that hold this node (and so every node above it)
    last_access: int = 0  # the tree's clock when a request last used this node
    num_sequences: int = 0  # inserted sequences that run through this node (repeats count again)

    @property
    def is_leaf(self) -> bool:
        return not self.children


def common_prefix_length(a, b) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class RadixTree:
    """Token sequences stored once per shared prefix. Time is a counter that ticks on every call
    that uses the tree, so "least recently used" is exact and repeatable."""

    def __init__(self):
        self.root = RadixNode((), None, id=0)
        self.clock = 0
        self._next_id = 1

    # --- looking up and adding ---------------------------------------------------------------

    def match_prefix(self, token_ids) -> int:
        """How many leading tokens of ``token_ids`` the tree already holds: down the tree for as
        long as the tokens agree, ending part-way along an edge if that is where they differ.
        The nodes it passes count as used now."""
        self.clock += 1
        node, matched = self.root, 0
        while matched < len(token_ids) and token_ids[matched] in node.children:
            node = node.children[token_ids[matched]]
            node.last_access = self.clock
            n = common_prefix_length(node.tokens, token_ids[matched:])
            matched += n
            if n < len(node.tokens):
                break
        return matched

    def insert(self, token_ids) -> RadixNode:
        """Add ``token_ids`` and return the node where it ends. Where it leaves an edge part-way,
        the edge is split in two, so every sequence ends exactly at a node (the node a request
        holds with ``lock``)."""
        self.clock += 1
        token_ids = tuple(token_ids)
        node, matched = self.root, 0
        while matched < len(token_ids):
            child = node.children.get(token_ids[matched])
            if child is None:  # nothing continues this way: the rest is one new edge
                node = self._add_child(node, token_ids[matched:])
                break
            n = common_prefix_length(child.tokens, token_ids[matched:])
            if n < len(child.tokens):
                child = self._split(child, n)
            node, matched = child, matched + n
        for n in self._path(node):
            n.num_sequences += 1
            n.last_access = self.clock
        return node

    def _add_child(self, parent: RadixNode, tokens) -> RadixNode:
        child = RadixNode(tuple(tokens), parent, id=self._next_id)
        self._next_id += 1
        parent.children[child.tokens[0]] = child
        return child

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut ``node``'s edge after ``at`` tokens: a new node takes the first part and ``node``
        keeps the rest (and its children), so a node that a request holds stays the same object.
        The new node is on every path through ``node``, so it takes over its counts."""
        upper = RadixNode(node.tokens[:at], node.parent, id=self._next_id)
        self._next_id += 1
        upper.ref_count, upper.last_access, upper.num_sequences = node.ref_count, node.last_access, node.num_sequences
        node.parent.children[upper.tokens[0]] = upper
        node.tokens, node.parent = node.tokens[at:], upper
        upper.children[node.tokens[0]] = node
        return upper

    # --- running requests hold their prefix ----------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        """A request starts using the sequence that ends at ``node``: it and every node above it
        gain a reference, so none of them can be evicted until ``unlock``."""
        self.clock += 1
        for n in self._path(node):
            n.ref_count += 1
            n.last_access = self.clock

    def unlock(self, node: RadixNode) -> None:
        """The request using ``node``'s sequence finished: its nodes may be evicted again, and
        count as used now (the most recently used are the last to go)."""
        if node is not self.root and node.ref_count == 0:
            raise ValueError(f"node {node.id} is not locked")
        self.clock += 1
        for n in self._path(node):
            n.ref_count -= 1
            n.last_access = self.clock

    def _path(self, node: RadixNode):
        """``node`` and every node above it, up to (not including) the root."""
        while node is not self.root:
            yield node
            node = node.parent

    # --- eviction ------------------------------------------------------------------------------

    def evictable_leaves(self) -> list[RadixNode]:
        """Leaves no running request holds: the only nodes eviction may take. An inner node's
        tokens are the prefix of its children's, so it can go only after they have."""
        return [n for n in self.nodes() if n.is_leaf and n.ref_count == 0 and n is not self.root]

    def evict(self, num_tokens: int) -> list[RadixNode]:
        """Free at least ``num_tokens`` tokens if possible, least recently used leaf first; a parent
        left childless becomes a leaf and may follow. Whole nodes go, so it can free a little more
        than asked, or less when every remaining leaf is held. Returns the evicted nodes in order.
        (SGLang keeps the leaves in a heap; scanning them is enough for a model.)"""
        evicted, freed = [], 0
        while freed < num_tokens:
            leaves = self.evictable_leaves()
            if not leaves:
                break
            victim = min(leaves, key=lambda n: n.last_access)
            del victim.parent.children[victim.tokens[0]]
            evicted.append(victim)
            freed += len(victim.tokens)
        return evicted

    # --- looking at it -------------------------------------------------------------------------

    def nodes(self) -> list[RadixNode]:
        """Every node, root first, each before its children (children in the order they arrived)."""
        found, stack = [], [self.root]
        while stack:
            node = stack.pop()
            found.append(node)
            stack.extend(reversed(node.children.values()))
        return found

    def edges(self) -> list[tuple[RadixNode, RadixNode]]:
        """``(parent, child)`` for every edge, in the order of ``nodes``."""
        return [(n.parent, n) for n in self.nodes() if n.parent is not None]

    @property
    def num_tokens(self) -> int:
        """Tokens held: each shared prefix counted once. (A real cache holds this many KV slots.)"""
        return sum(len(n.tokens) for n in self.nodes())


# --- the two designs on one workload ---------------------------------------------------------


def chained_block_hashes(token_ids, block_size: int) -> list[int]:
    """The hashes of ``token_ids``' full blocks, each chained to the one before, as
    ``PrefixCachingBlockManager`` names them; a last, partial block gets none."""
    hashes, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


@dataclass
class PrefixHit:
    """What each design finds of one prompt, given every earlier prompt of the workload."""

    prompt_len: int
    radix_tokens: int  # leading tokens the radix tree holds
    hash_chain_tokens: int  # tokens in the leading full blocks the hash chain holds

    @property
    def sub_block_tokens(self) -> int:
        """Tokens the tree finds that the chain misses: they do not fill a block."""
        return self.radix_tokens - self.hash_chain_tokens


def compare_prefix_hits(workload, block_size: int) -> list[PrefixHit]:
    """For each prompt in arrival order, the prefix the radix tree finds and the prefix the block
    hash chain finds, when every earlier prompt was cached whole and nothing was evicted (an
    unbounded cache; prompts only: a real engine also caches what it generates).

    ``workload``: a ``Workload`` or a list of prompts (token id lists). The hash chain is a plain
    set of chained block hashes, the rule of ``PrefixCachingBlockManager.find_cached_blocks``.
    Then ``hash_chain_tokens`` is always ``radix_tokens`` rounded down to a whole number of blocks.
    The engine itself looks up all but a prompt's last token (the last must be computed for its
    logits): pass ``prompt[:-1]`` lists to count what it would skip."""
    prompts = getattr(workload, "prompts", workload)
    tree, cached_hashes = RadixTree(), set()
    hits = []
    for prompt in prompts:
        hashes = chained_block_hashes(prompt, block_size)
        found_blocks = next((i for i, h in enumerate(hashes) if h not in cached_hashes), len(hashes))
        hits.append(PrefixHit(len(prompt), tree.match_prefix(prompt), found_blocks * block_size))
        tree.insert(prompt)
        cached_hashes.update(hashes)
    return hits
