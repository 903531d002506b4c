"""Causal attention over one sequence: the attention every engine computes, whatever its KV layout.

The backends (``contiguous``, ``ragged``, ...) call it on each request's keys and values, the model
calls it directly when it runs without a KV cache, and the paged kernels are tested against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v for one sequence, q: [T, H, D], k/v: [S, KVH, D] with S >= T.

    The queries are the last T of the S tokens: query i sits at position ``S - T + i`` and may see
    keys 0 .. S - T + i. Grouped-query attention: each group of H / KVH query heads shares one
    key/value head.
    """
    groups = q.shape[-2] // k.shape[-2]
    k = k.repeat_interleave(groups, dim=-2)
    v = v.repeat_interleave(groups, dim=-2)
    q, k, v = (t.transpose(-3, -2) for t in (q, k, v))  # [H, T, D]
    t, s = q.shape[-2], k.shape[-2]
    mask = None
    if t > 1:
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(-3, -2)  # [T, H, D]
