"""The contract between the model and the KV layout: an attention backend.

Every attention layer hands its new q, k, v to a backend and gets the attention output back; the
backend alone knows where keys and values live (a contiguous buffer, a padded batch, one cache per
request, paged blocks). That is why the model file never changes from chapter to chapter.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class AttentionBackend(Protocol):
    """What ``CausalLM`` needs from a backend: ``attend``, called once per layer per forward pass.

    ``attend(layer_idx, q, k, v)`` stores the new tokens' k, v for layer ``layer_idx`` after the
    ones already cached and returns softmax(q k^T / sqrt(d)) v over the cached and new keys, with q's
    shape. The leading dimensions are the layout's: ``[T]`` for one sequence or a flat token batch,
    ``[B, T]`` for a padded batch.

    ``advance`` is deliberately not part of the contract. The model never calls it: the runner does,
    once after the forward pass (when every layer has stored the new tokens), and only the runner
    knows how many tokens each sequence gained. So its signature is the layout's own:
    ``ContiguousKVCache.advance(num_new_tokens)`` and ``PaddedKVCache.advance(num_new_columns)``
    are told the count, while ``DecodeBatchKVCache.advance()`` (one token per request) and
    ``RaggedKVCache.advance()`` (the counts are its ``cu_seqlens``) already know it. Forcing one
    signature on all of them would make some take an argument they must ignore.

    ``runtime_checkable``: ``isinstance(x, AttentionBackend)`` checks that ``attend`` exists (not its
    signature), which is enough for a test or an assertion to catch a wrong object passed as the cache.
    """

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...
