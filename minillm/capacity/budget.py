"""Chapter 6's sizing question: the token budget an ITL target allows.

A decoding request waits for its next token as long as the step it rides in takes, and the slowest
steps are those that spend the whole budget: the worst inter-token gap grows with
``max_num_batched_tokens``, while a long prompt's TTFT falls (it needs fewer chunks). So the budget
that meets an ITL target with the best TTFT is the *largest* whose worst gap still meets it.

The worst gap never falls as the budget grows (a step given more tokens to compute is no faster), so
a bisection over budgets finds that largest one in a handful of simulated runs. Chapter 8 asks the
next question: with the budget set, how many requests per second the server takes.
"""

from __future__ import annotations

import math

from minillm.metrics import longest_gap
from minillm.sim import Profile, simulate
from minillm.workloads import Workload

BUDGET_TOLERANCE = 1.05  # the bisection stops when the largest budget that fails is within 5% of one that meets


def worst_itl_gap(profile: Profile, workload: Workload, **engine_options) -> float:
    """The longest gap between two tokens of any request, in seconds, on the simulated chunked engine."""
    result = simulate("chunked", workload, profile, block_maps=False, **engine_options)
    return longest_gap(result.outputs)


def choose_token_budget(
    profile: Profile, workload: Workload, itl_target: float, max_num_seqs: int = 64, num_gpu_blocks: int = 20000
) -> dict:
    """``{"max_num_batched_tokens": B}``: the largest budget (within 5%) whose worst gap between two
    tokens, simulated on ``profile`` with ``max_num_seqs`` slots, is at most ``itl_target`` seconds.
    A ValueError when even the smallest budget that keeps every slot decoding misses the target."""
    if not (isinstance(itl_target, (int, float)) and itl_target > 0):
        raise ValueError(f"itl_target must be a number of seconds above 0, got {itl_target!r}")
    options = {"max_num_seqs": max_num_seqs, "num_gpu_blocks": num_gpu_blocks}

    def meets(budget: int) -> bool:
        return worst_itl_gap(profile, workload, max_num_batched_tokens=budget, **options) <= itl_target

    # Below max_num_seqs a step with every slot decoding would leave decodes out: no smaller budget helps.
    low = max_num_seqs
    gap = worst_itl_gap(profile, workload, max_num_batched_tokens=low, **options)
    if gap > itl_target:
        raise ValueError(
            f"itl_target={itl_target * 1e3:.2f} ms cannot be met: with the smallest budget that keeps every slot "
            f"decoding ({low} tokens) the worst gap is already {gap * 1e3:.2f} ms"
        )
    # No step ever has more to compute than the longest prompt and a decode in every other slot.
    high = max(len(p) for p in workload.prompts) + max_num_seqs
    if meets(high):
        return {"max_num_batched_tokens": high}
    while high / low > BUDGET_TOLERANCE:  # invariant: low meets the target, high does not
        middle = round(math.sqrt(low * high))
        if middle in (low, high):
            break
        low, high = (middle, high) if meets(middle) else (low, middle)
    return {"max_num_batched_tokens": low}
