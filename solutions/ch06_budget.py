"""Chapter 6, part 2: the token budget an ITL target allows.

Sections 2 and 3 measured the trade-off: a larger ``max_num_batched_tokens`` lets long prompts
through in fewer chunks (lower TTFT), and makes the steps that spend it longer, so a decoding
request waits longer for its next token (a larger worst inter-token gap). A team serving chat
states the longest gap its users may see, and wants the best TTFT that target allows. You choose
the engine's options from the step-time model and the simulator of section 3, as an engineer
sizes a deployment before it runs on the device.

One exercise: ``choose_token_budget``. ``check("ch06_budget")`` runs your choice on the simulator,
for devices, workloads and targets it picks, against the best budget it finds by itself.
"""

from __future__ import annotations

from minillm.sim import Profile, simulate
from minillm.workloads import Workload


def choose_token_budget(
    profile: Profile, workload: Workload, itl_target: float, max_num_seqs: int = 64, num_gpu_blocks: int = 20000
) -> dict:
    """The chunked engine's options for serving ``workload`` on ``profile`` (a model on a device,
    as the simulator prices it) such that, in the run

        simulate("chunked", workload, profile, max_num_seqs=max_num_seqs, num_gpu_blocks=num_gpu_blocks, **options)

    * **the target holds**: no request waits more than ``itl_target`` seconds between two of its
      tokens (its worst gap: ``max(output.metrics.itl)``, over every output), and
    * **TTFT is as good as the target allows**: the 95th percentile of the outputs'
      ``metrics.ttft`` is within 15% (plus 1 ms) of the best the grader finds, with any budget it
      tries, among those that meet the target.

    Returns ``options``: a dict with ``"max_num_batched_tokens"`` (an int >= 1) and, if your design
    uses it, ``"long_prefill_token_threshold"`` (an int >= 0; 0 is no cap). Raises ``ValueError``,
    with a message that names ``itl_target``, when no budget of ``max_num_seqs`` tokens or more
    meets the target (a smaller budget would leave decodes out of a step where every slot decodes).

    ``profile.forward_time(num_seqs, num_tokens, context_tokens, attention_pairs)`` is the step-time
    model: the seconds one step takes (section 5 draws it). Examples, on section 3's H200 profile:
    a target of 1 ms raises ``ValueError`` (every step pays 3 ms of host overhead); targets of 5 to
    20 ms give budgets of a few hundred to a few thousand tokens.
    """

    # BEGIN SOLUTION
    # HINT: write choose_token_budget: the chunked engine's options that meet itl_target with the best TTFT
    def worst_gap(budget: int) -> float:
        run = simulate(
            "chunked",
            workload,
            profile,
            max_num_seqs=max_num_seqs,
            num_gpu_blocks=num_gpu_blocks,
            max_num_batched_tokens=budget,
            block_maps=False,  # no per-step copy of the block tables, which nothing here reads: faster
        )
        return max(max(o.metrics.itl, default=0.0) for o in run.outputs)

    smallest = max_num_seqs
    if worst_gap(smallest) > itl_target:
        raise ValueError(f"no token budget of {smallest} or more meets itl_target={itl_target} s")
    # The worst gap grows with the budget: find the largest budget that still meets the target.
    # A budget beyond the longest prompt plus a decode per slot computes the same steps.
    good, bad = smallest, max(len(p) for p in workload.prompts) + max_num_seqs + 1
    while bad - good > max(1, good // 32):
        middle = (good + bad) // 2
        if worst_gap(middle) <= itl_target:
            good = middle
        else:
            bad = middle
    return {"max_num_batched_tokens": good}
    # END SOLUTION
