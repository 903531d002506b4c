"""Attention kernels over a paged KV cache (chapter 5): a PyTorch reference and a Triton kernel."""

from minillm.kernels.paged_attention import paged_attention, paged_attention_reference

__all__ = ["paged_attention", "paged_attention_reference"]
