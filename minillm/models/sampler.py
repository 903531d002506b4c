"""Turn logits into next tokens on the device: greedy, temperature, top-k and top-p.

Each request draws from its own seeded ``torch.Generator``, so a request samples the same tokens
whether it runs alone (chapter 1) or packed beside others (later chapters).
"""

from __future__ import annotations

import torch

from minillm.sampling_params import SamplingParams


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the smallest set with mass >= top_p. The
    most likely token always stays, however small ``top_p`` is (at 1e-46 the mass would round to 0
    and drop every token, leaving a softmax over nothing)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already reach top_p.
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> torch.Tensor:
    """``logits``: ``[num_seqs, vocab]``, one row per request; returns ``[num_seqs]`` token ids.

    Python work is one small loop over requests, never over tokens or the vocabulary.
    """
    tokens = logits.argmax(dim=-1)
    for i, (p, g) in enumerate(zip(params, generators)):
        if p.greedy:
            continue
        row = logits[i].to(torch.promote_types(logits.dtype, torch.float32))  # fp16 / bf16 up: no overflow
        row = apply_top_k_top_p(row / p.temperature, p.top_k, p.top_p)
        probs = row.softmax(-1)
        # Exponential race: argmax(p / E) with E ~ Exp(1) is a draw from p, no host sync needed.
        noise = torch.empty_like(probs).exponential_(generator=g)
        tokens[i] = (probs / noise).argmax()
    return tokens
