"""Chapter 5: the block allocator of a paged KV cache (vLLM's ``KVCacheManager`` / block pool).

The KV pool is cut into ``num_blocks`` fixed-size blocks of ``block_size`` tokens. A request holds
a *block table*: the physical block ids of its logical blocks 0, 1, 2, ... in order. Blocks are
handed out just in time, as the request's tokens arrive, never reserved for tokens that may never
be generated: the only waste left is the unfilled tail of each request's last block.

Every block has a reference count (how many requests' tables hold it). Without prefix caching each
block has one owner; with it (``minillm.kv.prefix_cache``) requests that start with the same tokens
share their first blocks, and the count says when the last of them lets go.

Only bookkeeping lives here: the scheduler owns the manager; the KV tensors live in the runner.
"""

from __future__ import annotations

from collections import deque


class BlockManager:
    """Free list, per-request block tables and reference counts over ``num_blocks`` blocks."""

    def __init__(self, num_blocks: int, block_size: int):
        check_block_options(num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        # FIFO free list: a freed block goes to the back, so recently freed blocks are reused last
        # (what lets a prefix cache find them later; it also makes the block map easy to follow).
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.block_tables: dict[str, list[int]] = {}  # request id -> its physical blocks, in order

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (vLLM's ``kv_cache_usage``)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_block_table(self, request_id: str) -> list[int]:
        """The blocks ``request_id`` holds, in logical order (empty if none). The live list: read, don't change."""
        return self.block_tables.get(request_id, [])

    def num_new_blocks(self, request, num_new_tokens: int) -> int:
        """Blocks ``request`` still needs to hold its computed tokens plus ``num_new_tokens`` more."""
        needed = self.num_blocks_for(request.num_computed_tokens + num_new_tokens)
        return max(0, needed - len(self.get_block_table(request.request_id)))

    def can_fit(self, request, num_new_tokens: int) -> bool:
        return self.num_new_blocks(request, num_new_tokens) <= self.num_free_blocks

    def allocate_slots(self, request, num_new_tokens: int) -> bool:
        """Give ``request`` enough blocks for ``num_new_tokens`` more tokens after its computed ones.
        False, allocating nothing, when too few blocks are free (the scheduler then preempts)."""
        total = request.num_computed_tokens + num_new_tokens
        if total > request.max_num_tokens:
            raise ValueError(
                f"request {request.request_id}: {total} tokens would append past its block table "
                f"(at most {request.max_num_tokens} tokens: prompt + max_tokens)"
            )
        n = self.num_new_blocks(request, num_new_tokens)
        if n > self.num_free_blocks:
            return False
        table = self.block_tables.setdefault(request.request_id, [])
        for _ in range(n):
            block = self.take_free_block()
            self.ref_counts[block] = 1
            table.append(block)
        return True

    def take_free_block(self) -> int:
        """The free block handed out next: the one freed longest ago."""
        return self.free_block_ids.popleft()

    def share_blocks(self, request_id: str, block_ids: list[int]) -> None:
        """Put blocks another request holds at the start of ``request_id``'s (empty) table, counting
        one more reference to each: the hook prefix sharing needs."""
        if self.block_tables.get(request_id):
            raise ValueError(f"request {request_id} already holds blocks; shared blocks must start its table")
        for block in block_ids:
            if self.ref_counts[block] < 1:
                raise ValueError(f"block {block} is free: only held blocks can be shared")
        for block in block_ids:
            self.ref_counts[block] += 1
        self.block_tables[request_id] = list(block_ids)

    def free(self, request) -> list[int]:
        """Release every block ``request`` holds (a block returns to the free list when no table holds
        it any more). Returns the released table. A request holding nothing is a double free."""
        request_id = getattr(request, "request_id", request)
        table = self.block_tables.pop(request_id, None)
        if table is None:
            raise ValueError(f"double free: request {request_id} holds no blocks")
        for block in reversed(table):  # the tail first: the prompt blocks stay longest in the free list's back
            self._release(block)
        return table

    def free_blocks(self, request_id: str, block_ids: list[int]) -> None:
        """Release some of ``request_id``'s blocks; each must be in its table."""
        table = self.block_tables.get(request_id)
        if table is None:
            raise ValueError(f"double free: request {request_id} holds no blocks")
        for block in block_ids:
            if block not in table:
                raise ValueError(
                    f"block {block} is not held by request {request_id}: cannot free another request's block"
                )
        for block in block_ids:
            table.remove(block)
            self._release(block)

    def _release(self, block: int) -> None:
        if self.ref_counts[block] < 1:
            raise ValueError(f"double free of block {block}")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_block_ids.append(block)


def check_block_options(num_blocks, block_size) -> None:
    check_block_size(block_size)
    check_num_gpu_blocks(num_blocks)


def check_block_size(block_size) -> None:
    if (
        isinstance(block_size, bool)
        or not isinstance(block_size, int)
        or block_size < 1
        or block_size & (block_size - 1)
    ):
        raise ValueError(f"block_size must be a power of two >= 1, got {block_size!r}")


def check_num_gpu_blocks(num_blocks) -> None:
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise ValueError(f"num_gpu_blocks must be an integer >= 1, got {num_blocks!r}")
