"""TensorRT-LLM's policy (its PyTorch backend's scheduler) on minillm's paged engine.

TensorRT-LLM schedules a step in two stages [trtllm-scheduler-docs]:

  capacity     which requests hold KV capacity this step, by ``capacity_scheduler_policy``:
               GUARANTEED_NO_EVICT (its default) keeps every running request and counts against the
                 free blocks all it may still need, up to prompt + ``max_tokens``; a waiting request
                 is admitted, in order, only if its whole length fits what is left, and the first
                 that does not fit stops the walk -- no started request is ever paused;
               MAX_UTILIZATION counts only the next step's blocks and, when they run out, pauses the
                 latest started request (its KV freed, recomputed later), as vLLM preempts;
               STATIC_BATCH is GUARANTEED_NO_EVICT that admits only when nothing runs.
  micro-batch  which of those run this step: in that order (running decodes first under the no-evict
               policies), each costing its tokens (one for a decode, the rest of its prompt for a
               prefill) while ``max_batch_size`` requests and ``max_num_tokens`` tokens last; the first
               that does not fit stops the walk. With ``enable_chunked_prefill`` the decodes are
               charged first and prompts share what is left, first come first served, each cut chunk
               a whole number of blocks.

minillm allocates blocks as tokens arrive under every policy; GUARANTEED_NO_EVICT's accounting is
what makes sure they never run out.
"""

from __future__ import annotations

from minillm.engines.chunked import TokenBudgetScheduler
from minillm.engines.paged import PagedSchedulerOutput
from minillm.request import Request, RequestStatus
from minillm.scheduler import check_count, check_flag

CAPACITY_SCHEDULER_POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH")
# TensorRT-LLM's LLM API defaults [trtllm-scheduler-docs]: 2048 requests, 8192 tokens a step, KV blocks of
# 32 tokens, chunked prefill off.
DEFAULT_MAX_BATCH_SIZE = 2048
DEFAULT_MAX_NUM_TOKENS = 8192
DEFAULT_TOKENS_PER_BLOCK = 32


def check_capacity_scheduler_policy(capacity_scheduler_policy) -> None:
    if capacity_scheduler_policy not in CAPACITY_SCHEDULER_POLICIES:
        raise ValueError(
            f"capacity_scheduler_policy must be one of {CAPACITY_SCHEDULER_POLICIES}, got {capacity_scheduler_policy!r}"
        )


class TRTLLMScheduler(TokenBudgetScheduler):
    """TensorRT-LLM's capacity and micro-batch schedulers as one minillm scheduler, under its option
    names: ``capacity_scheduler_policy``, ``max_batch_size``, ``max_num_tokens`` and
    ``enable_chunked_prefill``. The pool is ``num_gpu_blocks`` x ``block_size`` (its
    ``tokens_per_block``, 32 by default)."""

    def __init__(
        self,
        capacity_scheduler_policy: str = "GUARANTEED_NO_EVICT",
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
        enable_chunked_prefill: bool = False,
        block_size: int = DEFAULT_TOKENS_PER_BLOCK,
        num_gpu_blocks: int | None = None,
    ):
        check_capacity_scheduler_policy(capacity_scheduler_policy)
        check_count("max_batch_size", max_batch_size)
        check_count("max_num_tokens", max_num_tokens)
        check_flag("enable_chunked_prefill", enable_chunked_prefill)
        if enable_chunked_prefill and max_num_tokens < block_size:
            raise ValueError(
                f"max_num_tokens={max_num_tokens} is less than one block (block_size={block_size}): with "
                "enable_chunked_prefill a chunk is a whole number of blocks, so no prompt could ever start"
            )
        super().__init__(
            max_num_seqs=max_batch_size,
            max_num_batched_tokens=max_num_tokens,
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
        )
        self.capacity_scheduler_policy = capacity_scheduler_policy
        self.enable_chunked_prefill = enable_chunked_prefill

    def check_request(self, request: Request) -> None:
        """Also: without chunked prefill a prompt must fit one step's ``max_num_tokens``."""
        super().check_request(request)
        if not self.enable_chunked_prefill and request.num_prompt_tokens > self.max_num_batched_tokens:
            raise ValueError(
                f"request {request.request_id}: its {request.num_prompt_tokens} prompt tokens exceed "
                f"max_num_tokens={self.max_num_batched_tokens}, and enable_chunked_prefill is off"
            )

    def schedule(self, now: float) -> PagedSchedulerOutput:
        """The running requests in the micro-batch's order, then the waiting ones the capacity stage
        lets start, while ``max_batch_size`` and ``max_num_tokens`` last; the first that does not fit
        stops the walk (with chunked prefill, a prompt with no room this step waits instead)."""
        plan = self.new_plan()
        if self.capacity_scheduler_policy == "MAX_UTILIZATION" and not self.enable_chunked_prefill:
            running = list(self.running)  # in the order they started
        else:  # generation first: decodes ahead of prompts part way through
            running = [r for r in self.running if r.is_decode] + [r for r in self.running if not r.is_decode]
        starting = self.fitting_waiting()
        budget = self.max_num_batched_tokens
        for request in running:
            if request.status is not RequestStatus.RUNNING:
                continue  # paused above as a victim
            n = self.cost(request, budget)
            if n == 0 or n > budget:
                if request.is_decode or not self.enable_chunked_prefill:
                    break
                continue
            budget += self.allocate_or_preempt(request, n, plan)  # pauses the last started (MAX_UTILIZATION)
            if request.status is RequestStatus.RUNNING:
                plan.scheduled.append(request)
                plan.num_scheduled_tokens[request.request_id] = n
                budget -= n
        if plan.preempted_ids:  # a pause ends the walk: nobody new starts this step
            return self.finish_plan(plan)
        for _ in range(starting):
            if len(self.running) >= self.max_num_seqs:
                break
            n = self.cost(self.waiting[0], budget)
            if n == 0 or n > budget or not self.admit_first(self.waiting, n, plan):
                break
            budget -= n
        return self.finish_plan(plan)

    def cost(self, request: Request, budget: int) -> int:
        """The tokens ``request`` computes if it runs this step: one for a decode, the rest of its prompt
        for a prefill -- with chunked prefill, as much of it as ``budget`` allows, a cut chunk rounded
        down to whole blocks (0: no room this step)."""
        n = request.num_tokens - request.num_computed_tokens
        if request.is_decode or not self.enable_chunked_prefill or n <= budget:
            return n
        return budget // self.block_size * self.block_size

    def fitting_waiting(self) -> int:
        """How many of ``waiting``, from its head, the capacity stage lets start this step."""
        if self.capacity_scheduler_policy == "MAX_UTILIZATION":
            return len(self.waiting)  # as many as the next step's blocks allow (admit_first checks them)
        if self.capacity_scheduler_policy == "STATIC_BATCH" and self.running:
            return 0
        bm = self.block_manager
        free = bm.num_free_blocks - sum(self.blocks_to_completion(r) for r in self.running)
        fitting = 0
        for request in self.waiting:
            need = self.blocks_to_completion(request)
            if need > free:
                break
            free -= need
            fitting += 1
        return fitting

    def blocks_to_completion(self, request: Request) -> int:
        """The blocks ``request`` may still take: those of prompt + ``max_tokens``, less those it holds."""
        bm = self.block_manager
        return bm.num_blocks_for(request.max_num_tokens) - len(bm.get_block_table(request.request_id))

    def stats(self) -> dict:
        return {
            **super().stats(),
            "capacity_scheduler_policy": self.capacity_scheduler_policy,
            "enable_chunked_prefill": self.enable_chunked_prefill,
        }
