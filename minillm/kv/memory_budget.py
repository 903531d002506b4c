"""How many KV blocks a memory budget buys: the paged engines' ``kv_cache_memory_bytes`` and
``gpu_memory_utilization`` options (vLLM's names), turned into ``num_gpu_blocks``.

One block holds the keys and the values of ``block_size`` tokens in every layer::

    block bytes = 2 (K and V) * layers * block_size * kv_heads * head_dim * bytes per element

``kv_cache_memory_bytes`` is a budget for the pools alone, on any device. ``gpu_memory_utilization``
is vLLM's: the share of the GPU's whole memory this engine may fill, its weights included, whatever
other processes hold (two engines at 0.5 can share one GPU). It is worked out as vLLM does,
profile then allocate, once, when the engine is built: one forward pass of the largest step the
engine may take (``max_num_batched_tokens`` tokens, else ``DEFAULT_PROFILE_TOKENS``) measures the
peak memory this process needs for weights and activations, and the pool gets what is left of the
share. The share must be free. With CUDA graphs, what the graphs will hold is left out of the pool
too: their memory pool keeps one step of the largest captured size's activations for good, so
a second pass of that many tokens measures it (an estimate; the runner's ``graph_memory_bytes``
is what the captures took).
"""

from __future__ import annotations

import torch

MEMORY_OPTIONS = ("num_gpu_blocks", "kv_cache_memory_bytes", "gpu_memory_utilization")
DEFAULT_PROFILE_TOKENS = 8192  # the profile pass of an engine without a token budget (capped by the context)


def kv_block_bytes(config, dtype: torch.dtype, block_size: int) -> int:
    """Bytes of one KV block over all layers (keys and values)."""
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * dtype.itemsize


def check_memory_options(options: dict) -> None:
    """At most one of ``MEMORY_OPTIONS`` sizes the pool, and each budget given is a valid number."""
    given = [name for name in MEMORY_OPTIONS if options.get(name) is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of {', '.join(MEMORY_OPTIONS)} to size the KV pool, got {', '.join(given)}")
    check_kv_cache_memory_bytes(options.get("kv_cache_memory_bytes"))
    check_gpu_memory_utilization(options.get("gpu_memory_utilization"))


def check_kv_cache_memory_bytes(budget_bytes) -> None:
    if budget_bytes is not None and (
        isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1
    ):
        raise ValueError(f"kv_cache_memory_bytes must be an integer >= 1, got {budget_bytes!r}")


def check_gpu_memory_utilization(utilization) -> None:
    if utilization is not None and (
        isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1
    ):
        raise ValueError(f"gpu_memory_utilization must be a fraction in (0, 1], got {utilization!r}")


def resolve_kv_memory(options: dict, model, device, graph_tokens: int = 0) -> dict:
    """``options`` with ``kv_cache_memory_bytes`` / ``gpu_memory_utilization`` replaced by the
    ``num_gpu_blocks`` they buy; at most one of the three may be given. ``graph_tokens``: the
    largest CUDA graph the runner will capture (0: none)."""
    check_memory_options(options)
    options = dict(options)
    budget_bytes, utilization = options.pop("kv_cache_memory_bytes", None), options.pop("gpu_memory_utilization", None)
    if budget_bytes is None and utilization is None:
        return options
    block_size = options["block_size"]
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a power of two >= 1, got {block_size!r}")
    if utilization is not None:
        profile_tokens = min(
            options.get("max_num_batched_tokens") or DEFAULT_PROFILE_TOKENS, model.config.max_position_embeddings
        )
        budget_bytes = gpu_budget(utilization, model, device, profile_tokens, graph_tokens)
    dtype = next(model.parameters()).dtype
    # tensor parallelism: each rank holds 1/N of every block's KV heads, so a budget per rank (per
    # GPU, as vLLM's is) buys N times the blocks
    per_block = kv_block_bytes(model.config, dtype, block_size) // options.get("tensor_parallel_size", 1)
    num_blocks = budget_bytes // per_block
    if num_blocks < 1:
        raise ValueError(
            f"a KV budget of {budget_bytes:,} bytes holds no block: one block of {block_size} tokens "
            f"takes {per_block:,} bytes for this model in {dtype}"
        )
    options["num_gpu_blocks"] = num_blocks
    return options


def gpu_budget(utilization: float, model, device, profile_tokens: int, graph_tokens: int = 0) -> int:
    """Bytes left for the KV pools when this engine may fill ``utilization`` of the GPU's memory:
    the share, less the peak this process reached in a forward pass of ``profile_tokens`` tokens,
    less what CUDA graphs of up to ``graph_tokens`` tokens will hold."""
    device = require_cuda(device)
    torch.cuda.reset_peak_memory_stats(device)
    profile_forward(model, profile_tokens)
    free, total = torch.cuda.mem_get_info(device)
    held, peak = torch.cuda.memory_reserved(device), torch.cuda.max_memory_reserved(device)
    peak += graphs_memory(model, device, graph_tokens)
    share = int(total * utilization)
    if free + held < share:
        raise ValueError(
            f"gpu_memory_utilization={utilization} asks for {share:,} bytes of the GPU's {total:,}, but only "
            f"{free + held:,} are free to this process (others hold the rest): lower it"
        )
    budget = share - peak  # the weights and the largest step's activations come out of the share
    if budget < 1:
        raise ValueError(
            f"gpu_memory_utilization={utilization} allows {share:,} bytes, but this process needs "
            f"{peak:,} for the weights and one step of {profile_tokens} tokens"
            + (f" (and CUDA graphs of up to {graph_tokens})" if graph_tokens else "")
            + ": nothing is left for the KV cache"
        )
    return budget


def graphs_memory(model, device, graph_tokens: int) -> int:
    """The activations of one forward pass of ``graph_tokens`` tokens, which the CUDA graphs' pool
    will hold (0 without graphs). Counted in allocated bytes, which memory PyTorch has already
    cached for the larger profile pass cannot hide."""
    if not graph_tokens:
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    profile_forward(model, graph_tokens)
    return torch.cuda.max_memory_allocated(device) - before


def require_cuda(device) -> torch.device:
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(
            f"gpu_memory_utilization needs a CUDA device, got {device}; "
            "size the pool with kv_cache_memory_bytes or num_gpu_blocks instead"
        )
    return device


@torch.inference_mode()
def profile_forward(model, num_tokens: int) -> None:
    """One forward pass of ``num_tokens`` dummy tokens as one sequence, without a KV cache, on the
    model's device: the activations the largest step needs. (Its attention scores are the part that
    grows as the square of the tokens; a paged step attends per request, so it needs less.)"""
    device = next(model.parameters()).device
    model(torch.zeros(num_tokens, dtype=torch.long, device=device), torch.arange(num_tokens, device=device), None)
