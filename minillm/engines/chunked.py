"""Chapter 6: chunked prefill -- a token budget per step.

The paged engine runs a new prompt whole, in the step that admits it. A 2,000-token prompt makes
that step as slow as a 2,000-token prefill, and every running request waits for it: one long prompt
stalls everyone's next token, and the inter-token latency (ITL) spikes. Chunked prefill caps the
tokens of a step at ``max_num_batched_tokens`` (vLLM's name) and splits a prompt that does not fit
into chunks, one per step, each attending to the prompt's tokens already in the KV cache:

  1. running requests first: the decodes (one token each), then the prompts part way through,
  2. then swapped-out requests and waiting ones, in order, while budget, slots and blocks last;

each given ``min(tokens it still needs, budget left)``. ``long_prefill_token_threshold`` (0: no
cap) caps what one request may take in a step, so a long prompt leaves room for the short ones
behind it. Blocks are allocated for each chunk as it is scheduled; when they run short, the newest
running request is preempted exactly as in chapter 5 (recompute or swap).

A request part way through its prompt holds its slot and blocks but is not sampled: the runner
samples a request only in the step that computes its last known token, so the paged runner runs
chunks as they are. Small budgets protect ITL (no step computes more than a budget of tokens);
large ones finish a prompt in fewer steps, which helps the time to first token (TTFT).
"""

from __future__ import annotations

from minillm.engines.paged import DEFAULT_BLOCK_SIZE, PagedScheduler, PagedSchedulerOutput
from minillm.request import Request, RequestStatus
from minillm.scheduler import DEFAULT_MAX_NUM_SEQS

# vLLM's default when chunked prefill came in (its docs: the best ITL on an A100 in the first
# benchmarks); vLLM V1 defaults to 2048 or more, for throughput. Chapter 6 sweeps it.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 512


def check_max_num_batched_tokens(max_num_batched_tokens) -> None:
    if (
        isinstance(max_num_batched_tokens, bool)
        or not isinstance(max_num_batched_tokens, int)
        or max_num_batched_tokens < 1
    ):
        raise ValueError(f"max_num_batched_tokens must be an integer >= 1, got {max_num_batched_tokens!r}")


def check_long_prefill_token_threshold(long_prefill_token_threshold) -> None:
    if (
        isinstance(long_prefill_token_threshold, bool)
        or not isinstance(long_prefill_token_threshold, int)
        or long_prefill_token_threshold < 0
    ):
        raise ValueError(
            f"long_prefill_token_threshold must be an integer >= 0 (0: no cap), got {long_prefill_token_threshold!r}"
        )


class TokenBudgetScheduler(PagedScheduler):
    """Chapter 6's options and the bookkeeping a budgeted ``schedule()`` uses, without the policy.

    It takes ``max_num_batched_tokens`` and ``long_prefill_token_threshold`` and offers four
    helpers that build a plan (chapter 5's preemption and admission, no budget in them); its
    ``schedule()`` is still chapter 5's, whole prompts and no budget. ``ChunkedPrefillScheduler``
    writes the budgeted one, and so does chapter 6's exercise, which extends this class."""

    def __init__(
        self,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        long_prefill_token_threshold: int = 0,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_gpu_blocks: int | None = None,
        preemption_mode: str = "recompute",
        enable_prefix_caching: bool = False,
    ):
        check_max_num_batched_tokens(max_num_batched_tokens)
        check_long_prefill_token_threshold(long_prefill_token_threshold)
        super().__init__(max_num_seqs, block_size, num_gpu_blocks, preemption_mode, enable_prefix_caching)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.long_prefill_token_threshold = long_prefill_token_threshold

    def new_plan(self) -> PagedSchedulerOutput:
        """An empty plan, for the helpers below to fill and ``finish_plan`` to complete."""
        return PagedSchedulerOutput(
            scheduled=[], num_scheduled_tokens={}, admitted_ids=[], preempted_ids=[], block_size=self.block_size
        )

    def allocate_or_preempt(self, request: Request, num_new_tokens: int, plan: PagedSchedulerOutput) -> int:
        """Allocate the blocks running ``request`` needs for ``num_new_tokens`` more tokens; while too
        few are free, preempt the newest running request (chapter 5: recompute or swap), which may be
        ``request`` itself. A victim already in ``plan`` leaves it; the tokens it had there are
        returned (0 when none), for the caller to give back to its budget. Afterwards ``request.status``
        is ``RequestStatus.RUNNING`` unless ``request`` was preempted; it is not added to ``plan``."""
        bm, given_back = self.block_manager, 0
        while not bm.allocate_slots(request, num_new_tokens):  # too few free blocks: preempt the newest request
            victim = self.preempt(plan.preempted_ids, plan.blocks_to_swap_out)
            if victim.request_id in plan.num_scheduled_tokens:  # scheduled earlier in this step
                plan.scheduled.remove(victim)
                given_back += plan.num_scheduled_tokens.pop(victim.request_id)
            if victim is request:
                break
        return given_back

    def admit_first(self, queue, num_new_tokens: int, plan: PagedSchedulerOutput) -> bool:
        """Admit ``queue[0]`` (``self.swapped`` or ``self.waiting``) with the blocks for
        ``num_new_tokens`` tokens: take it from ``queue``, ``_admit`` it (a slot, ``self.running``)
        and add it to ``plan`` (``scheduled``, ``num_scheduled_tokens``, ``admitted_ids``, and for a
        swapped request the blocks to copy back in). False, changing nothing, when too few blocks
        are free. It does not check the slots or a budget: the caller does."""
        bm = self.block_manager
        request = queue[0]
        if not bm.allocate_slots(request, num_new_tokens):
            return False
        queue.popleft()
        if queue is self.swapped:  # the blocks of its computed tokens come back from host memory
            plan.blocks_to_swap_in[request.request_id] = self.computed_blocks(request)
        self._admit(request)
        plan.admitted_ids.append(request.request_id)
        plan.scheduled.append(request)
        plan.num_scheduled_tokens[request.request_id] = num_new_tokens
        return True

    def finish_plan(self, plan: PagedSchedulerOutput) -> PagedSchedulerOutput:
        """``plan`` completed with what the runner needs: slots, block tables, swapped-out ids."""
        plan.slots = self.slots
        plan.block_tables = {r.request_id: self.block_manager.get_block_table(r.request_id) for r in plan.scheduled}
        plan.swapped_out_ids = [rid for rid in plan.preempted_ids if rid in plan.blocks_to_swap_out]
        return plan

    def stats(self) -> dict:
        return {
            **super().stats(),
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "long_prefill_token_threshold": self.long_prefill_token_threshold,
        }


class ChunkedPrefillScheduler(TokenBudgetScheduler):
    """The paged scheduler with a per-step token budget, ``max_num_batched_tokens``, shared out decodes
    first, as vLLM V0's chunked prefill and Sarathi do (V1's scheduler walks ``running`` in order,
    with no priority for decodes): decodes, then partly prefilled prompts, then new requests, each
    given ``min(tokens it still needs, budget left)`` (and at most ``long_prefill_token_threshold``,
    when it is not 0)."""

    def num_new_tokens(self, request: Request, budget: int) -> int:
        """What ``request`` computes this step: its tokens not yet in the KV cache, capped by the
        threshold and by the budget left."""
        n = request.num_tokens - request.num_computed_tokens
        if 0 < self.long_prefill_token_threshold < n:
            n = self.long_prefill_token_threshold
        return min(n, budget)

    def schedule(self, now: float) -> PagedSchedulerOutput:
        """Share ``max_num_batched_tokens`` out: running decodes, running prompts, then swapped and
        waiting requests, each oldest first; preempt the newest running request when blocks run short."""
        budget = self.max_num_batched_tokens
        plan = self.new_plan()
        self.cache_running_blocks()

        # 1. Running requests, decodes (one token to compute) first: with a budget of at least one
        #    token per running request, every decode runs every step, however long the prompts beside it.
        decodes = [r for r in self.running if r.is_decode]
        prefills = [r for r in self.running if not r.is_decode]
        for request in decodes + prefills:
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted above as a victim
            n = self.num_new_tokens(request, budget)
            budget += self.allocate_or_preempt(request, n, plan)  # a victim scheduled earlier gives its tokens back
            if request.status is RequestStatus.RUNNING:
                plan.scheduled.append(request)
                plan.num_scheduled_tokens[request.request_id] = n
                budget -= n

        # 2. Unless someone was preempted while others still run: swapped requests resume, then waiting
        #    ones are admitted, in order, while budget, slots and blocks last. A prompt may start with a chunk.
        if not plan.preempted_ids or not plan.scheduled:
            budget = self.admit_from(self.swapped, budget, plan)
            if not self.swapped:  # a swapped request resumes before any new admission
                self.admit_from(self.waiting, budget, plan)
        return self.finish_plan(plan)

    def admit_from(self, queue, budget: int, plan: PagedSchedulerOutput) -> int:
        """Admit ``queue``'s requests in order while budget, slots and blocks last; the budget left. A
        waiting request's cached prefix (with prefix caching on) costs no budget."""
        while queue and budget > 0 and len(self.running) < self.max_num_seqs:
            request = queue[0]
            hit = self.reuse_cached_prefix(request) if queue is self.waiting else None
            n = self.num_new_tokens(request, budget)
            if not self.admit_first(queue, n, plan):
                self.forget_cached_prefix(request, hit)
                break
            self.count_prefix_hit(request, hit)
            budget -= n
        return budget
