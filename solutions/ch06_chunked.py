"""Chapter 6: chunked prefill -- a token budget per step.

The paged engine of chapter 5 runs a new prompt whole, in the step that admits it: one long prompt
makes that step slow, and every running request waits for its next token. Chunked prefill caps the
tokens one step computes at ``max_num_batched_tokens`` (vLLM's name) and splits a prompt that does
not fit into chunks, one per step. A chunk attends to the prompt's tokens already in the KV cache,
so the paged runner computes it as it is; a request part way through its prompt is not sampled.

One exercise: ``MyChunkedScheduler.schedule``, the policy of minillm's ``chunked`` engine (vLLM V0's and
Sarathi's: decodes first).
Plug it in and watch your budget shape the engine's steps::

    llm = LLM("tiny", engine="chunked", max_num_batched_tokens=8, scheduler_cls=MyChunkedScheduler)

``check("ch06")`` compares every plan it makes with minillm's ``ChunkedPrefillScheduler``.
"""

from __future__ import annotations

from minillm.engines.chunked import TokenBudgetScheduler
from minillm.engines.paged import PagedSchedulerOutput
from minillm.request import RequestStatus


class MyChunkedScheduler(TokenBudgetScheduler):
    """The chunked engine's scheduler. You write its ``schedule``; the rest is given.

    ``TokenBudgetScheduler`` (chapter 5's paged scheduler plus chapter 6's options) keeps the
    queues, the slots and the blocks, and offers what chapter 5 already taught: preemption and
    admission. Its own ``schedule()`` is chapter 5's, with no budget: do not call it. What you can use:

    * ``self.max_num_batched_tokens``: the budget, the most tokens one step may compute (>= 1);
    * ``self.long_prefill_token_threshold``: the most tokens one request may compute in a step,
      when it is not 0 (0: no cap);
    * ``self.running`` (a list, oldest admitted first), ``self.swapped`` and ``self.waiting``
      (deques, the next to resume or admit at ``[0]``), ``self.max_num_seqs`` (the slots);
    * ``request.num_tokens`` (prompt plus generated so far), ``request.num_computed_tokens``
      (those already in the KV cache), ``request.status`` and ``request.request_id``;
    * ``self.new_plan()``: an empty plan (a ``PagedSchedulerOutput``) with ``scheduled`` (a list of
      requests), ``num_scheduled_tokens`` (request id -> tokens) and ``preempted_ids``;
    * ``self.allocate_or_preempt(request, n, plan)``: for a RUNNING request, allocates the blocks
      of its next ``n`` tokens; while too few are free it preempts the newest running request
      (which may be ``request`` itself), taking a victim already in ``plan`` out of it, and
      returns the tokens such victims had in ``plan`` (give them back to your budget). It does
      not add ``request`` to ``plan``: you do, if ``request.status is RequestStatus.RUNNING``;
    * ``self.admit_first(queue, n, plan)``: admits ``queue[0]`` with blocks for ``n`` tokens and
      adds it to ``plan`` with them; False, changing nothing, when too few blocks are free. It
      checks neither the slots nor the budget;
    * ``self.finish_plan(plan)``: completes the plan (slots, block tables) for the engine.
    """

    def schedule(self, now: float) -> PagedSchedulerOutput:
        """Share this step's budget of ``max_num_batched_tokens`` tokens out, decodes first (``now``
        is not needed). Start with ``budget = self.max_num_batched_tokens`` and ``plan = self.new_plan()``.

        A request is given ``n = min(its tokens not yet in the KV cache, budget left)`` tokens,
        and never more than ``long_prefill_token_threshold`` when that is not 0. Every request
        you plan takes its ``n`` from the budget, so a step never computes more than the budget.

        1. Running requests: first the decodes (``request.is_decode``), then the others (prompts
           part way through their prefill, recomputed tokens), each group in ``self.running``'s
           order. Stop when the budget is 0. Skip a request that was preempted by then (its
           ``status`` is no longer ``RequestStatus.RUNNING``). For each other one, compute ``n``,
           call ``allocate_or_preempt(request, n, plan)`` and add what it returns to the budget;
           then, if the request still runs, plan it (append it to ``plan.scheduled``, set
           ``plan.num_scheduled_tokens[request.request_id] = n``) and take ``n`` from the budget.
        2. Admissions, only if nobody was preempted this step or nothing is scheduled (as chapter
           5's scheduler): first resume ``self.swapped``, then, only once nobody is left swapped,
           admit from ``self.waiting``; each queue in order, while it is not empty, the budget is
           above 0 and fewer than ``max_num_seqs`` requests run. Its first request gets ``n`` as
           above (a prompt may start with a chunk); ``admit_first(queue, n, plan)`` admits it and
           plans it, and you take ``n`` from the budget. When it returns False (blocks short),
           admit nobody more from that queue: first come, first served.

        Return ``self.finish_plan(plan)``.

        Example, budget 8, no threshold: one request decoding and a 17-token prompt waiting. The
        first step plans ``{decode: 1, prompt: 7}``, the next two ``{decode: 1, prompt: 7}`` and
        ``{decode: 1, prompt: 3}``; the prompt's first token is sampled after its last chunk.
        """
        # BEGIN SOLUTION
        # HINT: write schedule(): one step's plan within the token budget
        budget = self.max_num_batched_tokens
        plan = self.new_plan()

        def tokens_for(request) -> int:
            n = request.num_tokens - request.num_computed_tokens
            if self.long_prefill_token_threshold > 0:
                n = min(n, self.long_prefill_token_threshold)
            return min(n, budget)

        decodes = [r for r in self.running if r.is_decode]
        prefills = [r for r in self.running if not r.is_decode]
        for request in decodes + prefills:
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted above, as a victim
            n = tokens_for(request)
            budget += self.allocate_or_preempt(request, n, plan)
            if request.status is RequestStatus.RUNNING:
                plan.scheduled.append(request)
                plan.num_scheduled_tokens[request.request_id] = n
                budget -= n

        if not plan.preempted_ids or not plan.scheduled:
            for queue in (self.swapped, self.waiting):
                if queue is self.waiting and self.swapped:
                    break  # a swapped request resumes before any new admission
                while queue and budget > 0 and len(self.running) < self.max_num_seqs:
                    n = tokens_for(queue[0])
                    if not self.admit_first(queue, n, plan):
                        break
                    budget -= n
        return self.finish_plan(plan)
        # END SOLUTION
