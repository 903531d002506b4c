"""Chapter 1's attention backend: one contiguous, preallocated buffer per request.

Without a cache, every decode step would recompute keys and values for the whole sequence: O(n)
work per token, O(n^2) per request. With it, a decode step computes k and v for one new token and
reads the rest back. The buffer is sized for the request's longest possible sequence up front, so
it never grows (chapter 5 shows what that reservation wastes, and fixes it with pages).
"""

from __future__ import annotations

import torch

from minillm.attention.causal import causal_attention


class ContiguousKVCache:
    """Keys and values of one sequence: ``[num_layers, max_len, num_kv_heads, head_dim]`` each, shaped
    by ``cfg`` (the model's ``ModelConfig``).

    The model calls ``attend`` once per layer during a forward pass; the caller calls ``advance``
    after the pass, once the new tokens' keys and values are stored in every layer.
    """

    def __init__(self, cfg, max_len: int, dtype: torch.dtype, device: torch.device):
        shape = (cfg.num_hidden_layers, max_len, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.num_tokens = 0  # positions 0 .. num_tokens-1 hold valid keys and values

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store the new tokens' k, v (``[T, KVH, D]``) after the cached ones; attend over all."""
        start, end = self.num_tokens, self.num_tokens + k.shape[0]
        if end > self.max_len:
            raise RuntimeError(f"KV cache overflow: {end} tokens > max_len {self.max_len}")
        self.k[layer_idx, start:end] = k  # self.k: [num_layers, max_len, KVH, D]
        self.v[layer_idx, start:end] = v
        return causal_attention(q, self.k[layer_idx, :end], self.v[layer_idx, :end])  # q's shape: [T, H, D]

    def advance(self, num_new_tokens: int) -> None:
        self.num_tokens += num_new_tokens

    @property
    def num_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
