"""TGI's policy (Hugging Face text-generation-inference, its v3 router) on minillm's paged engine.

Three rules set TGI apart from vLLM's scheduler [tgi-source-router]:

  reserve up front   a request is admitted only with blocks for its whole prompt and every token it
                     may generate (``max_tokens``); a running request never needs a block it does not
                     hold, so nothing is ever preempted -- and fewer requests run at once
  strictly in order  the queue is walked from its head; the first request that does not fit (blocks,
                     ``max_batch_prefill_tokens``) stops the walk, nobody behind it jumps ahead
  admit, then decode after a step that admitted requests, the next step only decodes; without
                     prefill chunking the admitting step runs the new prompts *alone* (the running
                     requests wait a step), and a running batch admits only when enough requests wait
                     (``waiting_served_ratio`` of it) or it has decoded ``max_waiting_tokens`` steps
                     since its last admission

With ``prefill_chunking`` (TGI's default where its attention backend allows it) the admitting step
is mixed: the running requests' next tokens first, then new prompts within what is left of
``max_batch_prefill_tokens``, the last admitted one cut to a chunk; later steps continue its prompt.
Unlike TGI, minillm does not re-queue a request every 1,024 generated tokens (TGI's cap on what one
request reserves) and offers no prefix caching here.
"""

from __future__ import annotations

from minillm.engines.chunked import TokenBudgetScheduler
from minillm.engines.paged import DEFAULT_BLOCK_SIZE, PagedSchedulerOutput
from minillm.request import Request, RequestStatus
from minillm.scheduler import check_count, check_flag

# TGI's launcher defaults; its max_batch_prefill_tokens falls back to 4,096 when
# it cannot size the budget from the GPU's FLOP/s.
DEFAULT_MAX_BATCH_PREFILL_TOKENS = 4096
DEFAULT_WAITING_SERVED_RATIO = 0.3
DEFAULT_MAX_WAITING_TOKENS = 20
UNBOUNDED_BATCH_SIZE = 1 << 30  # max_batch_size=None: TGI sets no bound on the requests of a batch


def check_waiting_served_ratio(waiting_served_ratio) -> None:
    value = waiting_served_ratio
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:  # not >= 0: nan too
        raise ValueError(f"waiting_served_ratio must be a number >= 0, got {value!r}")


class TGIScheduler(TokenBudgetScheduler):
    """TGI v3's batching loop as a minillm scheduler, under TGI's option names [tgi-launcher-docs]:
    ``max_batch_prefill_tokens`` (the prompt tokens one step may compute), ``waiting_served_ratio``,
    ``max_waiting_tokens``, ``max_batch_size`` (None: no bound) and ``prefill_chunking``.
    The pool (TGI's ``max_batch_total_tokens``) is ``num_gpu_blocks`` x ``block_size``."""

    def __init__(
        self,
        max_batch_prefill_tokens: int = DEFAULT_MAX_BATCH_PREFILL_TOKENS,
        waiting_served_ratio: float = DEFAULT_WAITING_SERVED_RATIO,
        max_waiting_tokens: int = DEFAULT_MAX_WAITING_TOKENS,
        max_batch_size: int | None = None,
        prefill_chunking: bool = True,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_gpu_blocks: int | None = None,
    ):
        check_count("max_batch_prefill_tokens", max_batch_prefill_tokens)
        check_waiting_served_ratio(waiting_served_ratio)
        check_count("max_waiting_tokens", max_waiting_tokens, least=0)
        if max_batch_size is not None:
            check_count("max_batch_size", max_batch_size)
        check_flag("prefill_chunking", prefill_chunking)
        super().__init__(
            max_num_seqs=max_batch_size or UNBOUNDED_BATCH_SIZE,
            max_num_batched_tokens=max_batch_prefill_tokens,
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
        )
        self.waiting_served_ratio = waiting_served_ratio
        self.max_waiting_tokens = max_waiting_tokens
        self.prefill_chunking = prefill_chunking
        self.waiting_steps = 0  # TGI's waiting_tokens: decode steps since the last admission
        self.decode_next = False  # a step admitted requests: the next one only decodes

    def check_request(self, request: Request) -> None:
        """The pool must hold the whole reservation; without chunking, a prompt must fit one step."""
        if self.reservation(request) > self.kv_capacity_tokens:
            raise ValueError(
                f"request {request.request_id}: {request.num_prompt_tokens} prompt tokens + max_tokens="
                f"{request.sampling_params.max_tokens} reserves {self.reservation(request)} KV cache tokens up "
                f"front, more than the whole pool (max_batch_total_tokens) of {self.kv_capacity_tokens} tokens"
            )
        if not self.prefill_chunking and request.num_prompt_tokens > self.max_num_batched_tokens:
            raise ValueError(
                f"request {request.request_id}: its {request.num_prompt_tokens} prompt tokens exceed "
                f"max_batch_prefill_tokens={self.max_num_batched_tokens}, and prefill_chunking is off"
            )

    @staticmethod
    def reservation(request: Request) -> int:
        """The KV tokens TGI reserves at admission: the prompt and every token but the last that may be
        generated (the last one is sampled, never computed)."""
        return request.max_num_tokens - 1

    def schedule(self, now: float) -> PagedSchedulerOutput:
        """A decode step right after a step that admitted into a running batch; otherwise an attempt to
        admit (mixed with the running requests' tokens when chunking, alone when not), and a decode
        step when nobody could be admitted."""
        plan = self.new_plan()
        if self.decode_next:
            self.decode_next = False
            return self.decode_step(plan)
        was_running = bool(self.running)
        budget = self.max_num_batched_tokens
        if self.prefill_chunking:  # the running requests' tokens first, new prompts in what is left
            budget -= self.schedule_running(plan)
        if self.admit_in_order(budget, plan):
            self.decode_next = was_running
            self.waiting_steps = 1  # TGI's waiting_tokens: 1 after an admission, one more per decode
            return self.finish_plan(plan)
        if self.prefill_chunking:
            self.waiting_steps += 1
            return self.finish_plan(plan)
        return self.decode_step(plan)

    def decode_step(self, plan: PagedSchedulerOutput) -> PagedSchedulerOutput:
        self.schedule_running(plan)
        self.waiting_steps += 1
        return self.finish_plan(plan)

    def schedule_running(self, plan: PagedSchedulerOutput) -> int:
        """Every running request's next tokens: one for a decode; a prompt part way through continues
        with what is left of the prefill budget (at least one token), oldest first. Their blocks are
        already reserved. Returns the tokens scheduled."""
        budget = self.max_num_batched_tokens - (len(self.running) - 1)
        total = 0
        for request in self.running:
            n = request.num_tokens - request.num_computed_tokens
            if not request.is_decode:
                n = max(1, min(n, budget))
                budget -= n
            if not self.block_manager.allocate_slots(request, n):  # never: admission reserved everything
                raise RuntimeError(f"request {request.request_id} outgrew the blocks reserved for it")
            plan.scheduled.append(request)
            plan.num_scheduled_tokens[request.request_id] = n
            total += n
        return total

    def admit_in_order(self, budget: int, plan: PagedSchedulerOutput) -> int:
        """Walk ``waiting`` from its head, admitting each request with its whole reservation while the
        blocks, the batch size and the prefill ``budget`` last; the first that does not fit stops the
        walk (with chunking, the last one admitted may take only a chunk of its prompt). Without
        chunking, a running batch admits only a group of at least ``waiting_served_ratio`` of its
        size, until it has decoded ``max_waiting_tokens`` steps since it last admitted. Returns how
        many were admitted."""
        bm, admitted, min_size = self.block_manager, [], 0
        if self.running and not self.prefill_chunking and self.waiting_steps < self.max_waiting_tokens:
            min_size = int(len(self.running) * self.waiting_served_ratio)
        if len(self.waiting) < min_size:
            return 0
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            remaining = request.num_tokens - request.num_computed_tokens
            if remaining > budget and not self.prefill_chunking:
                break
            if not bm.can_fit(request, self.reservation(request)):
                break
            n = min(remaining, budget)
            self.admit_first(self.waiting, n, plan)
            bm.allocate_slots(request, self.reservation(request))  # the rest of its reservation, now
            admitted.append(request)
            budget -= n
            if n < remaining:  # cut to a chunk: it ends the walk
                break
        if len(admitted) < min_size:
            for request in reversed(admitted):
                self.undo_admission(request, plan)
            return 0
        return len(admitted)

    def undo_admission(self, request: Request, plan: PagedSchedulerOutput) -> None:
        """Put an admitted request back at the head of ``waiting``, holding nothing."""
        self.running.remove(request)
        self.release_slot(request)
        self.block_manager.free(request)
        request.status = RequestStatus.WAITING
        plan.scheduled.remove(request)
        del plan.num_scheduled_tokens[request.request_id]
        plan.admitted_ids.remove(request.request_id)
        self.waiting.appendleft(request)

    def stats(self) -> dict:
        return {
            **super().stats(),
            "waiting_served_ratio": self.waiting_served_ratio,
            "max_waiting_tokens": self.max_waiting_tokens,
            "prefill_chunking": self.prefill_chunking,
        }
