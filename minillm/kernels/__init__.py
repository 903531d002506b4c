"""Attention kernels over a paged KV cache (chapter 5): the readable reference (the test oracle), a
batched PyTorch implementation (the CPU default) and a Triton kernel (the GPU default)."""

from minillm.kernels.paged_attention import (
    TorchAttentionPlan,
    paged_attention,
    paged_attention_reference,
    paged_attention_torch,
)

__all__ = ["TorchAttentionPlan", "paged_attention", "paged_attention_reference", "paged_attention_torch"]
