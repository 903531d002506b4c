"""Turn logits into next tokens on the device: greedy, temperature, top-k and top-p.

Each request draws from its own seeded ``torch.Generator``, so a request samples the same tokens
whether it runs alone (chapter 1) or packed beside others (later chapters). The sampling requests
of a step are filtered and drawn together, a few operations for all of them: only the random
draw is one call per request (its own generator). On a GPU each operation is a kernel launch, so a
loop of ten operations per request would cost a step of 256 sampling requests thousands of them.
"""

from __future__ import annotations

import torch

from minillm.sampling_params import SamplingParams


def apply_top_k_top_p(logits: torch.Tensor, top_k: int | list[int], top_p: float | list[float]) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the smallest set with mass >= top_p,
    row by row (``top_k`` and ``top_p``: one value for every row, or a list with one per row; a
    ``top_k`` of 0 keeps every token). The most likely token always stays, however small ``top_p``
    is (at 1e-46 the mass would round to 0 and drop every token, leaving a softmax over nothing)."""
    rows = logits.shape[:-1].numel()
    vocab = logits.shape[-1]
    ks = top_k if isinstance(top_k, list) else [top_k] * rows
    ps = top_p if isinstance(top_p, list) else [top_p] * rows
    ks = [k if 0 < k < vocab else vocab for k in ks]  # decided on the host: no device sync
    if min(ks) == vocab and min(ps) >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    if min(ks) < vocab:
        kth = sorted_logits.gather(-1, torch.tensor(ks, device=logits.device).view(*logits.shape[:-1], 1) - 1)
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if min(ps) < 1.0:
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already reach top_p.
        off = [p if p < 1.0 else float("inf") for p in ps]  # a row without top-p drops nothing, whatever the rounding
        top_p_rows = torch.tensor(off, dtype=probs.dtype, device=logits.device).view(*logits.shape[:-1], 1)
        drop_sorted = probs.cumsum(-1) - probs >= top_p_rows
        drop_sorted[..., 0] = False
        sorted_logits = sorted_logits.masked_fill(drop_sorted, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> torch.Tensor:
    """``logits``: ``[num_seqs, vocab]``, one row per request; returns ``[num_seqs]`` token ids.

    Greedy rows take the argmax; the sampling rows are scaled, filtered and drawn together, with
    one random draw per request from its own generator.
    """
    tokens = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return tokens
    index = torch.tensor(rows, device=logits.device)
    x = logits[index].to(torch.promote_types(logits.dtype, torch.float32))  # fp16 / bf16 up: no overflow
    x = x / torch.tensor([params[i].temperature for i in rows], dtype=x.dtype, device=x.device)[:, None]
    x = apply_top_k_top_p(x, [params[i].top_k for i in rows], [params[i].top_p for i in rows])
    probs = x.softmax(-1)
    # Exponential race: argmax(p / E) with E ~ Exp(1) is a draw from p, no host sync needed.
    noise = torch.empty_like(probs)
    for row, i in enumerate(rows):
        noise[row].exponential_(generator=generators[i])
    tokens[index] = (probs / noise).argmax(-1)
    return tokens
