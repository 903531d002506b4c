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

from minillm.paged_attention import DEFAULT_BLOCK_SIZE, PagedScheduler, PagedSchedulerOutput
from minillm.request import Request, RequestStatus
from minillm.scheduler import DEFAULT_MAX_NUM_SEQS

# vLLM's default when chunked prefill came in (its docs: the best ITL on an A100 in the first
# benchmarks); vLLM V1 defaults to 2048 or more, for throughput. Chapter 6 sweeps it.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 512


def check_budget_options(max_num_batched_tokens, long_prefill_token_threshold) -> None:
    if (isinstance(max_num_batched_tokens, bool) or not isinstance(max_num_batched_tokens, int)
            or max_num_batched_tokens < 1):
        raise ValueError(f"max_num_batched_tokens must be an integer >= 1, got {max_num_batched_tokens!r}")
    if (isinstance(long_prefill_token_threshold, bool) or not isinstance(long_prefill_token_threshold, int)
            or long_prefill_token_threshold < 0):
        raise ValueError(f"long_prefill_token_threshold must be an integer >= 0 (0: no cap), "
                         f"got {long_prefill_token_threshold!r}")


class ChunkedPrefillScheduler(PagedScheduler):
    """The paged scheduler with a per-step token budget, ``max_num_batched_tokens``, that it shares
    out as vLLM does: decodes first, then partly prefilled prompts, then new requests, each given
    ``min(tokens it still needs, budget left)`` (and at most ``long_prefill_token_threshold``, when
    it is not 0)."""

    def __init__(self, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                 max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS, long_prefill_token_threshold: int = 0,
                 block_size: int = DEFAULT_BLOCK_SIZE, num_gpu_blocks: int | None = None,
                 preemption_mode: str = "recompute"):
        check_budget_options(max_num_batched_tokens, long_prefill_token_threshold)
        super().__init__(max_num_seqs, block_size, num_gpu_blocks, preemption_mode)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.long_prefill_token_threshold = long_prefill_token_threshold

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
        bm = self.block_manager
        budget = self.max_num_batched_tokens
        scheduled, num_tokens, preempted, swap_out = [], {}, [], {}

        # 1. Running requests, decodes (one token to compute) first: with a budget of at least one
        #    token per running request, every decode runs every step, however long the prompts beside it.
        decodes = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
        prefills = [r for r in self.running if r.num_tokens - r.num_computed_tokens > 1]
        for request in decodes + prefills:
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted above as a victim
            n = self.num_new_tokens(request, budget)
            while not bm.allocate_slots(request, n):  # too few free blocks: preempt the newest request
                victim = self.running[-1]
                self._preempt(victim, preempted, swap_out)
                if victim.request_id in num_tokens:  # scheduled earlier in this step: its tokens go back to the budget
                    scheduled.remove(victim)
                    budget += num_tokens.pop(victim.request_id)
                if victim is request:
                    break
            if request.status is RequestStatus.RUNNING:
                scheduled.append(request)
                num_tokens[request.request_id] = n
                budget -= n

        # 2. Unless someone was preempted: swapped requests resume, then waiting ones are admitted,
        #    in order, while budget, slots and blocks last. A prompt may start with a chunk.
        admitted, swap_in = [], {}
        if not preempted or not scheduled:
            budget = self._admit_from(self.swapped, budget, scheduled, num_tokens, admitted, swap_in)
            if not self.swapped:  # a swapped request resumes before any new admission
                self._admit_from(self.waiting, budget, scheduled, num_tokens, admitted, swap_in)

        return PagedSchedulerOutput(
            scheduled=scheduled,
            num_scheduled_tokens=num_tokens,
            admitted_ids=admitted,
            preempted_ids=preempted,
            slots=self.slots,
            block_tables={r.request_id: bm.get_block_table(r.request_id) for r in scheduled},
            block_size=self.block_size,
            swapped_out_ids=[rid for rid in preempted if rid in swap_out],
            blocks_to_swap_out=swap_out,
            blocks_to_swap_in=swap_in,
        )

    def _admit_from(self, queue, budget: int, scheduled: list[Request], num_tokens: dict[str, int],
                    admitted: list[str], swap_in: dict[str, list[int]]) -> int:
        """Admit ``queue``'s requests in order while budget, slots and blocks last; the budget left."""
        bm = self.block_manager
        while queue and budget > 0 and len(self.running) < self.max_num_seqs:
            request = queue[0]
            n = self.num_new_tokens(request, budget)
            if not bm.allocate_slots(request, n):
                break
            queue.popleft()
            if queue is self.swapped:  # the blocks of its computed tokens come back from host memory
                swap_in[request.request_id] = bm.get_block_table(request.request_id)[
                    :bm.num_blocks_for(request.num_computed_tokens)]
            self._admit(request)
            admitted.append(request.request_id)
            scheduled.append(request)
            num_tokens[request.request_id] = n
            budget -= n
        return budget

    def _preempt(self, request: Request, preempted: list[str], swap_out: dict[str, list[int]]) -> None:
        super()._preempt(request, preempted, swap_out)
        if request.request_id in swap_out:
            # Copy out only the blocks that hold computed tokens: a victim scheduled earlier in this
            # step also holds the new, still empty blocks of its chunk.
            table = swap_out[request.request_id]
            swap_out[request.request_id] = table[:self.block_manager.num_blocks_for(request.num_computed_tokens)]

    def stats(self) -> dict:
        return {**super().stats(), "max_num_batched_tokens": self.max_num_batched_tokens,
                "long_prefill_token_threshold": self.long_prefill_token_threshold}
