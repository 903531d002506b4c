"""Chapter 8b: TensorRT-LLM's GUARANTEED_NO_EVICT admission, on minillm's paged engine.

vLLM admits a request when the blocks of its *prompt* are free, and preempts someone when the running
requests' next tokens find no block. TensorRT-LLM's default policy never has to: it admits a request
only when the blocks of its *whole length* -- prompt and every token it may generate -- fit beside
everything the running requests may still take. Fewer requests run at once; none is ever paused.

One exercise: ``MyNoEvictScheduler.schedule``. It plugs into the paged engine::

    llm = LLM("tiny", engine="paged", block_size=4, num_gpu_blocks=12, scheduler_cls=MyNoEvictScheduler)

``check("ch08_no_evict")`` grades it on hand-made pools (whom it admits, step by step, against the
rule) and inside the engine (the naive engine's tokens, no preemption, every block free at the end).
"""

from __future__ import annotations

from minillm.engines.chunked import TokenBudgetScheduler


class MyNoEvictScheduler(TokenBudgetScheduler):
    """The paged engine's scheduler with guaranteed-no-evict admission. The contract:

    * Every running request runs in every step, computing all its tokens not yet in the KV cache
      (one, for a decode); its blocks never run out, so nobody is ever preempted.
    * A request's *whole length* is ``request.max_num_tokens`` tokens (prompt + ``max_tokens``), and
      ``self.block_manager.num_blocks_for(n)`` blocks hold ``n`` tokens. What a running request may
      still take is the blocks of its whole length it does not hold yet
      (``len(self.block_manager.get_block_table(request_id))`` it holds).
    * Waiting requests are admitted in their queue's order while ``max_num_seqs`` allows, each only
      if the blocks of its whole length fit in the free blocks (``self.block_manager.num_free_blocks``)
      less what every running request -- and every request admitted before it in this step -- may
      still take. The first that does not fit stops admission for this step: no request behind it
      jumps ahead. An admitted request computes its whole prompt in the step that admits it.

    Given (``TokenBudgetScheduler``): ``new_plan()`` starts a plan; ``admit_first(self.waiting, n,
    plan)`` admits the queue's first request with the blocks for ``n`` tokens and adds it to the plan;
    ``finish_plan(plan)`` completes it. A running request goes into the plan with
    ``plan.scheduled.append(request)`` and ``plan.num_scheduled_tokens[request.request_id] = n``, after
    ``self.block_manager.allocate_slots(request, n)`` gave it the blocks for ``n`` more tokens.
    """

    def schedule(self, now: float):
        # BEGIN SOLUTION
        # HINT: write schedule() to the contract in the class docstring
        bm = self.block_manager
        plan = self.new_plan()
        for request in self.running:
            n = request.num_tokens - request.num_computed_tokens
            if not bm.allocate_slots(request, n):  # its whole length was counted when it was admitted
                raise RuntimeError(f"request {request.request_id} found no free block")
            plan.scheduled.append(request)
            plan.num_scheduled_tokens[request.request_id] = n
        free = bm.num_free_blocks - sum(self.blocks_still_needed(r) for r in self.running)
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            need = bm.num_blocks_for(request.max_num_tokens)
            if need > free:
                break
            free -= need
            self.admit_first(self.waiting, request.num_tokens - request.num_computed_tokens, plan)
        return self.finish_plan(plan)

    def blocks_still_needed(self, request) -> int:
        """The blocks of ``request``'s whole length it does not hold yet."""
        bm = self.block_manager
        return bm.num_blocks_for(request.max_num_tokens) - len(bm.get_block_table(request.request_id))
        # END SOLUTION
