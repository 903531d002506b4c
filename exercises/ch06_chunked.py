# Generated from solutions/ch06_chunked.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: eec810312a83325e
"""Chapter 6: chunked prefill -- a token budget per step.

The paged engine of chapter 5 runs a new prompt whole, in the step that admits it: one long prompt
makes that step slow, and every running request waits for its next token. Chunked prefill caps the
tokens one step computes at ``max_num_batched_tokens`` (vLLM's name) and splits a prompt that does
not fit into chunks, one per step. A chunk attends to the prompt's tokens already in the KV cache,
so the paged runner computes it as it is; a request part way through its prompt is not sampled.

One exercise: ``MyChunkedScheduler.schedule``, a budgeted policy of your design (minillm's ``chunked``
engine runs vLLM V0's and Sarathi's: decodes first). Plug it in and watch your budget shape the
engine's steps::

    llm = LLM("tiny", engine="chunked", max_num_batched_tokens=8, scheduler_cls=MyChunkedScheduler)

``check("ch06")`` runs it in the engine and checks, at every step, the contract ``schedule``'s
docstring states, and that every request generates the naive engine's tokens.
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
        """Plan this step within its token budget: which requests compute how many tokens (``now``
        is not needed). How the budget is shared out is yours to design; the engine relies on this:

        * **The budget.** The step plans at most ``self.max_num_batched_tokens`` tokens in all; each
          planned request at least 1 token and at most the tokens it has not computed yet
          (``num_tokens - num_computed_tokens``), and at most ``long_prefill_token_threshold`` when
          that is not 0. A prompt that does not fit runs in chunks, over several steps.
        * **Decodes never starve.** A running request with one token left to compute
          (``request.is_decode``) runs in every step, unless it was preempted, or the step's whole
          budget went to such decodes.
        * **Every request finishes.** While requests run or wait, steps keep making progress: a
          prompt as long as the budget, or longer, still gets its turn.
        * **Memory.** A running request is planned only once ``allocate_or_preempt`` gave it its
          blocks (give back to the budget the tokens it returns); a swapped or waiting request
          joins through ``admit_first``, while fewer than ``max_num_seqs`` requests run.

        Return ``self.finish_plan(plan)``.

        Example, budget 8, no threshold: one request decoding and a 17-token prompt waiting. Plans
        that keep the contract: ``{decode: 1, prompt: 7}``, ``{decode: 1, prompt: 7}``, then
        ``{decode: 1, prompt: 3}``; the prompt's first token is sampled after its last chunk.
        """
        raise NotImplementedError("write schedule(): one step's plan within the token budget")
