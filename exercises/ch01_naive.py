# Generated from solutions/ch01_naive.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: 7b796e479b3eb620
"""Chapter 1: generate tokens one request at a time, and measure how long that takes.

Two exercises:

* ``decode_loop``: greedy generation with a KV cache. A *prefill* runs the whole prompt through the
  model in one forward pass; each *decode* step then runs one new token, reading every earlier
  token's keys and values back from the cache instead of recomputing them.
* ``latency_metrics``: the three numbers a user feels, from the times each token appeared.

The notebook plugs your ``decode_loop`` into a timeline next to minillm's engine; ``check("ch01")``
grades both functions.
"""

from __future__ import annotations

import torch

from minillm.attention.contiguous import ContiguousKVCache


@torch.inference_mode()  # no autograd bookkeeping: we only ever run the model forward
def decode_loop(model, prompt_token_ids: list[int], max_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """Greedily generate up to ``max_tokens`` tokens after ``prompt_token_ids``; return them as a list
    of Python ints (the generated tokens only, not the prompt).

    1. Make one cache, before the loop, with room for the prompt and every token you might generate:
       ``ContiguousKVCache(model.config, len(prompt_token_ids) + max_tokens, dtype, device)``, with
       the model's own dtype and device (``next(model.parameters())`` has both: the model may be
       bfloat16 or float64, and on a GPU).
    2. Prefill: one forward pass over the whole prompt, ``hidden = model(ids, positions, cache)``,
       where ``ids`` is a 1-D tensor of the prompt's token ids and ``positions`` is
       ``0, 1, ..., len(prompt) - 1`` (both on the model's device).
    3. After *every* forward pass, tell the cache how many tokens it now holds:
       ``cache.advance(number of tokens in that pass)``. The model stores the new keys and values
       but does not count them; without ``advance`` the next pass overwrites them.
    4. The last row of ``hidden`` predicts the next token: ``model.compute_logits(hidden[-1:])``
       gives its logits, and greedy decoding picks the argmax.
    5. Decode: feed only that new token, at the next position (a prompt of ``n`` tokens has
       positions ``0 .. n-1``, its first generated token position ``n``, the next ``n + 1``, ...),
       then advance the cache and pick the next token again (steps 3 and 4).

    Stop after ``max_tokens`` tokens (``max_tokens=1``: the prefill's token, no decode pass), or as
    soon as you generate ``eos_token_id``, the prefill's token included (keep that token in the
    output, as minillm's engine does). ``eos_token_id`` may be ``0``, a real token id; ``None``
    means no EOS. The result must equal ``LLM.generate``'s greedy tokens.
    """
    raise NotImplementedError("write decode_loop: greedy generation with one KV cache, as its docstring states")


def latency_metrics(arrival_time: float, token_times: list[float]) -> dict:
    """Latencies of one request from its timestamps (seconds on one clock).

    ``arrival_time`` is when the request arrived; ``token_times[i]`` is when generated token ``i``
    appeared. Return ``{"ttft": ..., "itl": [...], "e2e": ...}``:

    * ``ttft``, time to first token: from arrival to the first token (queueing plus prefill);
    * ``itl``, inter-token latencies: the gap between each pair of consecutive tokens (one fewer
      than the number of tokens, so ``[]`` for a single token);
    * ``e2e``, end-to-end latency: from arrival to the last token.
    """
    raise NotImplementedError("write latency_metrics: one request's TTFT, gaps between tokens, and end-to-end latency")
