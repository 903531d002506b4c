"""Chapter 3's attention backend: a ``[B]`` batch of decode tokens, one per request, each request
with its own contiguous cache (so its own past length)."""

from __future__ import annotations

import torch

from minillm.attention.contiguous import ContiguousKVCache


class DecodeBatchKVCache:
    """Attention backend for a batch of decode tokens, token i belonging to the request whose cache
    is ``caches[i]``: every other layer sees one ``[B]`` batch; attention reads each request's own
    past, whose length differs from request to request."""

    def __init__(self, caches: list[ContiguousKVCache]):
        self.caches = caches

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.cat(
            [c.attend(layer_idx, q[i : i + 1], k[i : i + 1], v[i : i + 1]) for i, c in enumerate(self.caches)]
        )

    def advance(self) -> None:
        for cache in self.caches:
            cache.advance(1)
