"""Chapter 2's attention backend: one KV buffer for a left-padded ``[B, T]`` batch.

Row b's first ``pad_lens[b]`` columns are padding; the mask in ``padded_causal_attention`` keeps
them invisible, so every real token sees exactly what it would see alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def padded_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad_lens: torch.Tensor) -> torch.Tensor:
    """``causal_attention`` for a left-padded batch. q: ``[B, T, H, D]``, the last T of the S columns
    of k, v: ``[B, S, KVH, D]``; row b's first ``pad_lens[b]`` columns are padding.

    The query in column i may see keys j <= i that are not padding. A pad query would then see
    nothing (a softmax over no keys is NaN), so every query also sees itself.
    """
    t, s = q.shape[1], k.shape[1]
    q_col = torch.arange(s - t, s, device=q.device)[:, None]  # [T, 1]
    k_col = torch.arange(s, device=q.device)[None, :]  # [1, S]
    is_key = k_col >= pad_lens[:, None, None]  # [B, 1, S]
    mask = (k_col <= q_col) & (is_key | (k_col == q_col))  # [B, T, S]
    groups = q.shape[-2] // k.shape[-2]
    k = k.repeat_interleave(groups, dim=-2)
    v = v.repeat_interleave(groups, dim=-2)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [B, H, T, D]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])  # the mask broadcasts over heads
    return out.transpose(1, 2)  # [B, T, H, D]


class PaddedKVCache:
    """Keys and values of a left-padded batch: ``[num_layers, B, max_len, num_kv_heads, head_dim]``,
    shaped by ``cfg`` (the model's ``ModelConfig``).

    Every row advances by the same number of columns per step; ``num_tokens`` counts the columns
    written so far, left pads included.
    """

    def __init__(self, cfg, pad_lens: torch.Tensor, max_len: int, dtype: torch.dtype, device: torch.device):
        shape = (cfg.num_hidden_layers, len(pad_lens), max_len, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.pad_lens = pad_lens
        self.max_len = max_len
        self.num_tokens = 0

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store the new columns' k, v (``[B, T, KVH, D]``) after the cached ones; attend over all."""
        start, end = self.num_tokens, self.num_tokens + k.shape[1]
        if end > self.max_len:
            raise RuntimeError(f"KV cache overflow: {end} columns > max_len {self.max_len}")
        self.k[layer_idx, :, start:end] = k
        self.v[layer_idx, :, start:end] = v
        return padded_causal_attention(q, self.k[layer_idx, :, :end], self.v[layer_idx, :, :end], self.pad_lens)

    def advance(self, num_new_tokens: int) -> None:
        self.num_tokens += num_new_tokens

    @property
    def batch_size(self) -> int:
        return len(self.pad_lens)
