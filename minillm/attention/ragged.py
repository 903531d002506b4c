"""Chapter 4's attention backend: one flat token batch split by ``cu_seqlens`` into each request's
ragged segment; each segment attends over its own request's contiguous cache."""

from __future__ import annotations

import torch

from minillm.attention.contiguous import ContiguousKVCache


class RaggedKVCache:
    """The attention backend of one flat batch: segment i (tokens ``cu_seqlens[i]:cu_seqlens[i+1]``)
    belongs to the request whose cache is ``caches[i]``.

    ``cu_seqlens`` stays a host list: splitting by it costs no device sync. (A varlen attention
    kernel takes it as a device tensor and does the loop below in one launch.)
    """

    def __init__(self, caches: list[ContiguousKVCache], cu_seqlens: list[int]):
        self.caches = caches
        self.cu_seqlens = cu_seqlens

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: ``[num_tokens, H, D]``, k, v: ``[num_tokens, KVH, D]``. Each request stores its new
        keys and values in its own cache and attends over its own past only."""
        cu = self.cu_seqlens
        out = [cache.attend(layer_idx, q[s:e], k[s:e], v[s:e]) for cache, s, e in zip(self.caches, cu, cu[1:])]
        return torch.cat(out)

    def advance(self) -> None:
        cu = self.cu_seqlens
        for cache, s, e in zip(self.caches, cu, cu[1:]):
            cache.advance(e - s)
