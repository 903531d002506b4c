# Generated from solutions/ch07_prefix_caching.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: 66d502ab930565a8
"""Chapter 7: prefix caching (vLLM's automatic prefix caching): computed KV blocks found again by name.

The keys and values of a token depend on that token and every token before it, so a request can
reuse another's KV blocks only for a prefix the two share exactly. vLLM names each *full* block by a
hash chained over the blocks before it::

    name(block 0) = hash_block(None, its tokens)
    name(block i) = hash_block(name(block i - 1), its tokens)

so equal names mean equal tokens from the very first one to the end of the block. A new prompt hashes
its own full blocks in order and starts its block table with every block already cached, up to the
first miss; it computes only the tokens after them.

A block whose last holder finishes keeps its name: it goes to the back of the free queue, where a
later prompt can still find it. The allocator evicts it (forgets its name) only when it takes the
block for new tokens, least recently freed first.

One exercise: ``MyPrefixCachingBlockManager``, chapter 5's allocator with reference counts, names,
lookup and eviction (``hash_block`` is yours too). ``MyPrefixCachingScheduler`` at the bottom plugs it
into the engine::

    llm = LLM("tiny", engine="chunked", block_size=4, enable_prefix_caching=True,
              scheduler_cls=MyPrefixCachingScheduler)

``check("ch07")`` grades it on its own (hand-made cases) and inside the engine (the tokens of the
engine without the cache, the hits of minillm's allocator, every block free again at the end).
"""

from __future__ import annotations

from collections import deque

from minillm.engines.chunked import ChunkedPrefillScheduler


def hash_block(parent_hash: int | None, token_ids) -> int:
    """The name of a full block: an int that depends on ``token_ids`` (a list or a tuple of ints: the
    same tokens give the same name either way) and on ``parent_hash``, the name of the block before
    it (None for a request's first block). Blocks with the same tokens after different prefixes get
    different names: their keys and values differ. (Python's ``hash`` of a tuple is one answer.)"""
    raise NotImplementedError("write hash_block: a name for a block's tokens and every token before them")


class MyPrefixCachingBlockManager:
    """A paged KV cache's allocator whose full, computed blocks stay findable by name.

    Given: the state (``__init__``), chapter 5's bookkeeping and ``allocate_slots``, which takes each
    new block from ``take_free_block``. You write the lookup, the sharing, the naming, ``free``, the
    eviction and the reset. The contract the engine relies on:

    * Reference counts: ``ref_counts[b]`` is how many block tables hold block ``b``. A block is free
      (in ``free_block_ids``, counted by ``num_free_blocks``) exactly when no table holds it; a free
      block is never in a table, and a held one is never handed out.
    * Names: ``cached_block_ids`` maps each name (``hash_block``'s chain) to the block that holds
      those tokens' keys and values; lookups find only what is there. Only full blocks whose tokens are
      all computed are named: a partial block is still being written.
    * The free queue is least recently freed first: ``take_free_block`` hands out its front, ``free``
      adds to its back. A freed block keeps its name until ``take_free_block`` hands it out: that is
      the eviction, and the only one (a held block is never evicted).

    A request is read through ``request.request_id``, ``request.num_computed_tokens`` (its tokens
    whose keys and values are in the cache) and ``request.token_ids_slice(start, end)`` (tokens
    ``start:end`` of its prompt and generated tokens).
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_block_ids: deque[int] = deque(range(num_blocks))  # the free queue: the next block to hand out first
        self.ref_counts = [0] * num_blocks  # block id -> how many block tables hold it
        self.block_tables: dict[str, list[int]] = {}  # request id -> the blocks it holds, in logical order
        self.cached_block_ids: dict[int, int] = {}  # name (block hash) -> the block that holds those tokens
        self.block_hashes: list[int | None] = [None] * num_blocks  # block id -> its name, while it has one

    # --- given: chapter 5's bookkeeping -------------------------------------------------------------
    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
        return -(-num_tokens // self.block_size)

    def get_block_table(self, request_id: str) -> list[int]:
        """The blocks ``request_id`` holds, in logical order (empty if none)."""
        return self.block_tables.get(request_id, [])

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def allocate_slots(self, request, num_new_tokens: int) -> bool:
        """Chapter 5's: the blocks ``request`` is missing for ``num_new_tokens`` more tokens, each from
        ``take_free_block`` and held once; False, allocating nothing, when too few are free."""
        missing = self.num_blocks_for(request.num_computed_tokens + num_new_tokens)
        missing -= len(self.get_block_table(request.request_id))
        if missing > self.num_free_blocks:
            return False
        table = self.block_tables.setdefault(request.request_id, [])
        for _ in range(missing):
            block = self.take_free_block()
            self.ref_counts[block] = 1
            table.append(block)
        return True

    # --- yours ----------------------------------------------------------------------------------------
    def find_cached_blocks(self, token_ids: list[int]) -> list[int]:
        """The cached blocks that hold ``token_ids``' first full blocks, in order, up to the first
        block whose name is not cached. A partial block at the end is never looked up. A lookup only:
        it changes nothing. The scheduler asks for a prompt about to be admitted (all but its last
        token: at least one token must be computed, for its logits)."""
        raise NotImplementedError(
            "write find_cached_blocks: the cached blocks of a prompt's first full blocks, up to the first miss"
        )

    def share_cached_blocks(self, request_id: str, block_ids: list[int]) -> None:
        """Start the block table of ``request_id`` (which holds no block yet) with ``block_ids``, found
        by ``find_cached_blocks``: each is held once more. A block that was free (its holders finished,
        its name kept) is held again, so it is no longer free and cannot be evicted."""
        raise NotImplementedError(
            "write share_cached_blocks: the found blocks start the request's table, each held once more"
        )

    def cache_full_blocks(self, request) -> None:
        """Name every full block of ``request``'s table whose tokens are all computed (prompt or
        generated), so later lookups find it. A block whose name another block already has stays
        unnamed: lookups keep finding the one named first. The scheduler calls this at every step
        for every running request, and before it frees a request's blocks; a named block stays named."""
        raise NotImplementedError("write cache_full_blocks: name the request's full, computed blocks")

    def free(self, request) -> list[int]:
        """Let go of every block ``request`` holds, remove its table and return it. Each block is held
        once less; one that no table holds any more goes to the back of the free queue, keeping its
        name. The table's blocks join the queue last block first, so a request's first blocks (the ones
        other prompts share, and the start of every chain of names) are evicted last."""
        raise NotImplementedError(
            "write free: each block held once less; a block nobody holds joins the free queue, name kept"
        )

    def take_free_block(self) -> int:
        """The free block to hand out for new tokens (``allocate_slots`` calls this when at least one
        is free): the front of the free queue, the least recently freed. Its tokens are about to be
        overwritten, so it loses its name: no lookup finds it any more."""
        raise NotImplementedError("write take_free_block: evict the least recently freed block")

    def reset_prefix_cache(self) -> bool:
        """Forget every name (vLLM's ``reset_prefix_cache``), so the next lookups start cold, and return
        True. While any request holds a block, refuse: change nothing and return False."""
        raise NotImplementedError("write reset_prefix_cache")


class MyPrefixCachingScheduler(ChunkedPrefillScheduler):
    """The chunked engine's scheduler (chapter 6's, minillm's policy) on your allocator when prefix
    caching is on: ``LLM("tiny", engine="chunked", enable_prefix_caching=True,
    scheduler_cls=MyPrefixCachingScheduler)``. It looks each prompt up before admitting it, shares what
    it finds, and names the blocks each step computes."""

    prefix_caching_block_manager_cls = MyPrefixCachingBlockManager
