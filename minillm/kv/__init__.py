"""KV-cache bookkeeping that is not an attention backend: the paged engines' block allocator and
the memory budget that sizes their pool. (The KV tensors themselves live in the runners; the
layouts the model reads through live in ``minillm.attention``.)

    block_manager.py   free list, block tables, reference counts (``BlockManager``)
    prefix_cache.py    blocks found again by a hash of their tokens (``PrefixCachingBlockManager``)
    memory_budget.py   bytes -> blocks: ``kv_cache_memory_bytes``, ``gpu_memory_utilization``
"""
