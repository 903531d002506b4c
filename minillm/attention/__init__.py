"""Attention backends: the one place that knows where keys and values live.

The model calls ``backend.attend(layer_idx, q, k, v)`` in every layer and nothing else; each chapter
swaps in a backend for its KV layout, so the model file never changes.

    base.py           the contract: ``AttentionBackend``, a Protocol with ``attend``
    contiguous.py     ch1: one preallocated buffer per request (``ContiguousKVCache``)
    padded.py         ch2: one buffer for a left-padded ``[B, T]`` batch (``PaddedKVCache``)
    decode_batch.py   ch3: a ``[B]`` batch of decode tokens over per-request caches (``DecodeBatchKVCache``)
    ragged.py         ch4: one flat token batch split by ``cu_seqlens`` (``RaggedKVCache``)
    paged.py          ch5: paged KV blocks

The chapter modules (``kv_cache``, ``padded_batch``, ``continuous_batching``,
``selective_batching``) import their backend from here, so the names learners know still work there.
"""

from minillm.attention.base import AttentionBackend
from minillm.attention.contiguous import ContiguousKVCache
from minillm.attention.decode_batch import DecodeBatchKVCache
from minillm.attention.padded import PaddedKVCache
from minillm.attention.ragged import RaggedKVCache

__all__ = ["AttentionBackend", "ContiguousKVCache", "DecodeBatchKVCache", "PaddedKVCache", "RaggedKVCache"]
