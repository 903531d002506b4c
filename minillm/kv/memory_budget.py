"""How many KV blocks a memory budget buys: the paged engines' ``kv_cache_memory_bytes`` and
``gpu_memory_utilization`` options (vLLM's names), turned into ``num_gpu_blocks``.

One block holds the keys and the values of ``block_size`` tokens in every layer::

    block bytes = 2 (K and V) * layers * block_size * kv_heads * head_dim * bytes per element

``kv_cache_memory_bytes`` is a budget for the pools alone, on any device. ``gpu_memory_utilization``
is vLLM's: the share of the GPU's whole memory this engine may fill, its weights included, whatever
other processes hold (two engines at 0.5 can share one GPU). What this process's PyTorch already
holds (the weights) is taken off the share; the share must be free. vLLM also runs a dummy forward
pass to measure the activations' peak and takes that off too; minillm does not, so leave a few
percent of headroom.
"""

from __future__ import annotations

import torch

MEMORY_OPTIONS = ("num_gpu_blocks", "kv_cache_memory_bytes", "gpu_memory_utilization")


def kv_block_bytes(config, dtype: torch.dtype, block_size: int) -> int:
    """Bytes of one KV block over all layers (keys and values)."""
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * dtype.itemsize


def resolve_kv_memory(options: dict, model, device) -> dict:
    """``options`` with ``kv_cache_memory_bytes`` / ``gpu_memory_utilization`` replaced by the
    ``num_gpu_blocks`` they buy; at most one of the three may be given."""
    options = dict(options)
    budget_bytes, utilization = options.pop("kv_cache_memory_bytes", None), options.pop("gpu_memory_utilization", None)
    given = [name for name, value in (("num_gpu_blocks", options.get("num_gpu_blocks")),
                                      ("kv_cache_memory_bytes", budget_bytes),
                                      ("gpu_memory_utilization", utilization)) if value is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of {', '.join(MEMORY_OPTIONS)} to size the KV pool, got {', '.join(given)}")
    if budget_bytes is None and utilization is None:
        return options
    if utilization is not None:
        budget_bytes = _budget_from_utilization(utilization, device)
    elif isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1:
        raise ValueError(f"kv_cache_memory_bytes must be an integer >= 1, got {budget_bytes!r}")
    block_size = options["block_size"]
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a power of two >= 1, got {block_size!r}")
    dtype = next(model.parameters()).dtype
    per_block = kv_block_bytes(model.config, dtype, block_size)
    num_blocks = budget_bytes // per_block
    if num_blocks < 1:
        raise ValueError(f"a KV budget of {budget_bytes:,} bytes holds no block: one block of {block_size} tokens "
                         f"takes {per_block:,} bytes for this model in {dtype}")
    options["num_gpu_blocks"] = num_blocks
    return options


def _budget_from_utilization(utilization, device) -> int:
    """Bytes left for the KV pools when this engine may fill ``utilization`` of the GPU's memory."""
    if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be a fraction in (0, 1], got {utilization!r}")
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"gpu_memory_utilization needs a CUDA device, got {device}; "
                         "size the pool with kv_cache_memory_bytes or num_gpu_blocks instead")
    free, total = torch.cuda.mem_get_info(device)
    share, ours = int(total * utilization), torch.cuda.memory_reserved(device)
    if free + ours < share:
        raise ValueError(f"gpu_memory_utilization={utilization} asks for {share:,} bytes of the GPU's {total:,}, but only "
                         f"{free + ours:,} are free to this process (others hold the rest): lower it")
    budget = share - ours  # the weights (and whatever else this process holds) come out of the share
    if budget < 1:
        raise ValueError(f"gpu_memory_utilization={utilization} allows {share:,} bytes, but this process holds "
                         f"{ours:,} already: nothing is left for the KV cache")
    return budget
