"""Automatic prefix caching: full KV blocks found again by a hash of their tokens (vLLM's design).

Real traffic repeats itself: a system prompt on every request, a chat that resends its history. The
keys and values of a token depend on every token before it, so a block can be reused only by a
request whose tokens *up to the end of that block* are the same. vLLM therefore names each full
block by a hash chained over the blocks before it::

    hash(block i) = hash(hash(block i-1), the block_size tokens of block i)

and keeps ``block hash -> block id``. Unlike vLLM, which names a block as soon as the step that fills
it is scheduled (so a request later in the same step can share it [vllm-prefix-caching-design]),
minillm names a block once its keys and values are computed, at the start of the next step. A new request
walks its own full blocks, hashing as it goes, and shares every block found until the first miss;
its ``num_computed_tokens`` starts after them. Only full blocks are named: a partly filled block is
still being written.

A cached block whose last holder finishes is not wiped: it goes to the free queue with its hash, so
a later request can still find it. It is evicted (its hash forgotten) only when the allocator takes
it for new tokens, least recently freed first. A hit on such a block takes it out of the queue.
"""

from __future__ import annotations

from collections import OrderedDict

from minillm.kv.block_manager import BlockManager


def hash_block(parent_hash: int | None, token_ids) -> int:
    """The name of a full block: its tokens and the hash of the block before it (None for the first)."""
    return hash((parent_hash, tuple(token_ids)))


class FreeBlockQueue:
    """Free blocks in the order they were freed (vLLM's ``FreeKVCacheBlockQueue``): taken from the
    front, returned to the back, and any block can leave from the middle when a prefix hit reuses it.
    An ordered dict gives all three in constant time."""

    def __init__(self, block_ids):
        self._blocks = OrderedDict.fromkeys(block_ids)

    def popleft(self) -> int:
        return self._blocks.popitem(last=False)[0]

    def append(self, block: int) -> None:
        self._blocks[block] = None

    def remove(self, block: int) -> None:
        del self._blocks[block]

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self):
        return iter(self._blocks)

    def __contains__(self, block) -> bool:
        return block in self._blocks


class PrefixCachingBlockManager(BlockManager):
    """``BlockManager`` whose full, computed blocks stay findable by hash until they are evicted."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.free_block_ids = FreeBlockQueue(range(num_blocks))
        self.cached_block_ids: dict[int, int] = {}  # block hash -> block id (vLLM: cached_block_hash_to_block)
        self.block_hashes: list[int | None] = [None] * num_blocks  # block id -> its hash, while it is cached
        self.request_hashes: dict[str, list[int]] = {}  # request id -> the hashes of its leading full blocks

    def find_cached_blocks(self, token_ids: list[int]) -> list[int]:
        """The cached blocks that hold ``token_ids``' first full blocks, up to the first miss."""
        blocks, parent = [], None
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            parent = hash_block(parent, token_ids[start : start + self.block_size])
            block = self.cached_block_ids.get(parent)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def share_cached_blocks(self, request_id: str, block_ids: list[int]) -> None:
        """Start ``request_id``'s (empty) table with cached blocks, one more reference each; a block
        nobody held leaves the free queue, so it can no longer be evicted."""
        if self.block_tables.get(request_id):
            raise ValueError(f"request {request_id} already holds blocks; cached blocks must start its table")
        for block in block_ids:
            if self.ref_counts[block] == 0:
                self.free_block_ids.remove(block)
            self.ref_counts[block] += 1
        self.block_tables[request_id] = list(block_ids)
        self.request_hashes[request_id] = [self.block_hashes[b] for b in block_ids]

    def cache_full_blocks(self, request) -> None:
        """Name every full block of ``request`` whose tokens are all computed, so later requests can
        find it. A block with the same hash already cached keeps the name; this one stays unnamed."""
        table = self.get_block_table(request.request_id)
        hashes = self.request_hashes.setdefault(request.request_id, [])
        num_full = min(request.num_computed_tokens // self.block_size, len(table))
        for i in range(len(hashes), num_full):
            tokens = request.token_ids_slice(i * self.block_size, (i + 1) * self.block_size)
            hashes.append(hash_block(hashes[-1] if hashes else None, tokens))
            if hashes[-1] not in self.cached_block_ids:
                self.cached_block_ids[hashes[-1]] = table[i]
                self.block_hashes[table[i]] = hashes[-1]

    def free(self, request) -> list[int]:
        self.request_hashes.pop(getattr(request, "request_id", request), None)
        return super().free(request)

    def take_free_block(self) -> int:
        """The least recently freed block, its hash forgotten: its tokens are about to be overwritten."""
        block = super().take_free_block()
        cached_hash, self.block_hashes[block] = self.block_hashes[block], None
        if cached_hash is not None:
            del self.cached_block_ids[cached_hash]
        return block

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's ``reset_prefix_cache``). Refused (False) while any
        request holds blocks: their hashes are still being extended."""
        if self.num_free_blocks != self.num_blocks:
            return False
        self.cached_block_ids.clear()
        self.block_hashes = [None] * self.num_blocks
        return True
