"""Chapter 5's attention backend: keys and values in a paged pool, read through block tables.

Each layer owns one preallocated pool per K and V, ``[num_blocks, block_size, num_kv_heads, head_dim]``
(vLLM's layout). A step's new keys and values are scattered into it through the *slot mapping*, one
flat index per token (``block * block_size + offset``), built once per step by the runner. Then one
``paged_attention`` call per layer serves every request of the flat batch, prefill and decode alike:
no Python loop over requests on the hot path.
"""

from __future__ import annotations

import torch

from minillm import kernels  # looked up per call, so a test can count the calls

ATTENTION_BACKENDS = ("torch", "triton", "cpu")


class PagedKVCache:
    """The attention backend of one step over the paged pools.

    ``block_tables`` ``[num_seqs, max_blocks]``, ``seq_lens`` ``[num_seqs]`` (context including this
    step's tokens) and ``query_start_loc`` ``[num_seqs + 1]`` are int32 device tensors, as the kernel
    takes them. ``backend="torch"`` runs the kernel module's PyTorch implementation (any block size;
    the step's decodes in one batched call), ``"triton"`` the Triton kernel, ``"cpu"`` the PyTorch
    implementation with the decodes in chapter 9's C kernel (float32 on the CPU).
    """

    def __init__(
        self,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        scale: float,
        backend: str = "torch",
    ):
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {backend!r}")
        self.k_caches, self.v_caches = k_caches, v_caches
        self.slot_mapping = slot_mapping
        self.block_tables, self.seq_lens, self.query_start_loc = block_tables, seq_lens, query_start_loc
        self.scale = scale
        self.backend = backend
        self.checked = False  # the triton backend checks the step's arguments in its first layer only
        # the torch backend's layout of this step (which rows decode, their tables and masks): the
        # same in every layer, so worked out once here rather than in each layer's call
        self.torch_plan = (
            kernels.TorchAttentionPlan(block_tables, seq_lens, query_start_loc, k_caches[0].shape[1], backend == "cpu")
            if backend in ("torch", "cpu")
            else None
        )

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q ``[num_tokens, H, D]``, k, v ``[num_tokens, KVH, D]``: write k, v to their slots, then
        attend over each request's blocks in one call."""
        k_cache, v_cache = self.k_caches[layer_idx], self.v_caches[layer_idx]  # [num_blocks, block_size, KVH, D]
        # viewed as [num_blocks * block_size, KVH, D]: token i's k, v go to row slot_mapping[i]
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, self.slot_mapping, k)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, self.slot_mapping, v)
        return self.paged_attention(q, k_cache, v_cache)  # [num_tokens, H, D]

    def paged_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """The step's one attention call over one layer's pools, new keys and values already in place."""
        if self.backend == "triton":
            args = (q, k_cache, v_cache, self.block_tables, self.seq_lens, self.query_start_loc, self.scale)
            if not self.checked:  # the wrapper: its argument checks, then the kernel
                self.checked = True
                return kernels.paged_attention(*args, backend="triton")
            # the other layers pass the same tables and lengths, and pools shaped like the first's: the
            # kernel itself, without some twenty Python checks in every layer of every step
            from minillm.kernels.triton_paged_attention import triton_paged_attention  # imports triton lazily

            return triton_paged_attention(*args)
        # The PyTorch implementation directly, from the step's plan: paged_attention's argument checks
        # read the tensors back to the host, which is fine once but not in every layer of every step.
        return self.torch_plan.attend(q, k_cache, v_cache, self.scale)
