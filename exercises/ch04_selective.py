# Generated from solutions/ch04_selective.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: 41013087cb29c525
"""Chapter 4: selective batching (Orca): one flat batch of tokens, attention per sequence.

A step of continuous batching mixes a 40-token prefill with single-token decodes. Padding them into a
``[B, T]`` rectangle would be mostly padding. Instead, the tokens of all sequences are concatenated
into one flat batch and described by ``cu_seqlens``, the cumulative sequence lengths (the name
FlashAttention's varlen kernels and vLLM use)::

    tokens       a0 a1 a2 a3 | b7 | c5      (A prefills 4 tokens, B and C decode one each)
    cu_seqlens   0           4    5    6    (sequence i is tokens cu_seqlens[i]:cu_seqlens[i+1])

Every layer except attention treats tokens independently, so it runs on the flat batch as it is.
Attention alone must respect the boundaries: each sequence's queries see only that sequence's keys.

Two exercises, three functions:

* ``pack`` / ``unpack``: sequences to one flat tensor plus ``cu_seqlens``, and back;
* ``ragged_attention``: causal attention over a flat batch, what a varlen attention kernel computes
  (FlashAttention's ``flash_attn_varlen_func`` with ``causal=True``), written in plain PyTorch.

``check("ch04")`` grades them against ``minillm.attention.causal.causal_attention`` run on one sequence at a time.
"""

from __future__ import annotations

import math
from itertools import accumulate

import torch


def pack(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate sequences along their first dimension; return ``(flat, cu_seqlens)``.

    ``seqs[i]`` has shape ``[n_i, ...]`` (the trailing dimensions, e.g. ``[n_i, hidden]`` or just
    ``[n_i]`` for token ids, are the same for all). ``flat`` is ``[n_0 + n_1 + ..., ...]``;
    ``cu_seqlens`` is a 1-D integer tensor of ``len(seqs) + 1`` offsets on ``flat``'s device:
    ``[0, n_0, n_0 + n_1, ...]``, so sequence i is ``flat[cu_seqlens[i]:cu_seqlens[i + 1]]``.

    Example: sequences of lengths 4, 1 and 1 give a ``flat`` of 6 rows and ``cu_seqlens``
    ``tensor([0, 4, 5, 6])``.
    """
    raise NotImplementedError("write pack")


def unpack(flat: torch.Tensor, cu_seqlens: torch.Tensor) -> list[torch.Tensor]:
    """The inverse of ``pack``: the list of sequences, ``flat[cu_seqlens[i]:cu_seqlens[i + 1]]``."""
    raise NotImplementedError("write unpack")


def ragged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor
) -> torch.Tensor:
    """Causal attention for a flat batch of sequences; return the output, with ``q``'s shape, dtype
    and device (bfloat16 in, bfloat16 out).

    ``q``: ``[num_q_tokens, H, D]``; ``k``, ``v``: ``[num_k_tokens, KVH, D]``. Sequence i owns queries
    ``q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]]`` and keys and values ``k[cu_seqlens_k[i]:cu_seqlens_k[i + 1]]``
    (both offsets are 1-D integer tensors, as ``pack`` makes them). A sequence has at least as many
    keys as queries: its keys are its whole context so far (what the KV cache holds plus the new
    tokens) and its queries are the *last* ones, the new tokens. So with ``n_k`` keys and ``n_q``
    queries, query j of the sequence sits at position ``n_k - n_q + j`` and may see keys
    ``0 .. n_k - n_q + j`` of its own sequence, and nothing of any other sequence.

    * A prefill has ``n_q == n_k``: ordinary causal attention.
    * A decode step has ``n_q == 1``: its one query sees every key of its sequence.

    Each query head h attends with ``softmax(q k^T / sqrt(D)) v``. Grouped-query attention: when
    ``KVH < H``, each group of ``H // KVH`` consecutive query heads shares one key/value head, so
    query head h uses key/value head ``h // (H // KVH)``.

    The result must equal ``minillm.attention.causal.causal_attention(q_i, k_i, v_i)`` on each sequence alone.
    """
    raise NotImplementedError("write ragged_attention: causal attention over a packed batch")
