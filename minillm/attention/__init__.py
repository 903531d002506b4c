"""Attention backends: the one place that knows where keys and values live.

The model calls ``backend.attend(layer_idx, q, k, v)`` in every layer and nothing else; each chapter
swaps in a backend for its KV layout, so the model file never changes.

    base.py           the contract: ``AttentionBackend``, a Protocol with ``attend``
    causal.py         ``causal_attention`` over one sequence: what every backend computes
    contiguous.py     ch1: one preallocated buffer per request (``ContiguousKVCache``)
    padded.py         ch2: one buffer for a left-padded ``[B, T]`` batch (``PaddedKVCache``)
    decode_batch.py   ch3: a ``[B]`` batch of decode tokens over per-request caches (``DecodeBatchKVCache``)
    ragged.py         ch4: one flat token batch split by ``cu_seqlens`` (``RaggedKVCache``)
    paged_kv.py       ch5: paged KV blocks read through block tables (``PagedKVCache``)

The engines (``minillm.engines``) hand the model the backend of their KV layout at every step.
"""

from minillm.attention.base import AttentionBackend
from minillm.attention.causal import causal_attention
from minillm.attention.contiguous import ContiguousKVCache
from minillm.attention.decode_batch import DecodeBatchKVCache
from minillm.attention.padded import PaddedKVCache
from minillm.attention.ragged import RaggedKVCache

__all__ = [
    "AttentionBackend",
    "causal_attention",
    "ContiguousKVCache",
    "DecodeBatchKVCache",
    "PaddedKVCache",
    "RaggedKVCache",
]
