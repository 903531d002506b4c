# Generated from solutions/ch08_no_evict.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: 4857c39c545248c9
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
        raise NotImplementedError("write schedule() to the contract in the class docstring")
