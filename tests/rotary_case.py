"""A rotary-embedding case shared by the fast path's two implementations of it (``cpu_ops`` in C,
``compiled_ops`` through torch.compile): q (3 heads) then k (1 head) then v in each token's row, as
the fused qkv matmul writes them."""

from __future__ import annotations

import torch

from minillm.models.llama import apply_rope


def check_q_and_k_rotated_in_place(rotary_embedding_) -> None:
    """``rotary_embedding_(x, positions, cos_sin_cache)`` on the q and k heads of a fused qkv output
    rotates them in place, each by its token's position, and leaves v as it was."""
    torch.manual_seed(0)
    tokens, head_dim = 9, 16
    qkv = torch.randn(tokens, 5 * head_dim)
    angles = torch.outer(torch.arange(100.0), 1.0 / 10000 ** (torch.arange(0, head_dim, 2) / head_dim))
    cos_sin_cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    positions = torch.tensor([0, 5, 99, 3, 3, 42, 7, 1, 60])
    cos, sin = cos_sin_cache[positions].unsqueeze(-2).chunk(2, dim=-1)
    heads = qkv.view(tokens, 5, head_dim)
    expected = torch.cat((apply_rope(heads[:, :4], cos, sin), heads[:, 4:]), dim=1)
    rotary_embedding_(qkv[:, : 4 * head_dim].view(tokens, 4, head_dim), positions, cos_sin_cache)
    torch.testing.assert_close(qkv.view(tokens, 5, head_dim), expected)  # v (the last head) untouched
