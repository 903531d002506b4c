# Generated from solutions/ch03_scheduling.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: 95f027edf08a2248
"""Chapter 3: iteration-level scheduling (Orca), the idea behind continuous batching.

A static batch is formed once and runs until its longest request is done. Orca's scheduler runs
before *every* step instead: a request that finished leaves the batch at once, and a waiting
request takes its slot at the very next step.

One exercise: ``IterationLevelScheduler.schedule``, the policy of minillm's ``continuous`` engine.
Plug it in and watch your scheduler drive the real engine::

    llm = LLM("tiny", engine="continuous", max_num_seqs=2, scheduler_cls=IterationLevelScheduler)

``check("ch03")`` compares every decision it makes with minillm's own scheduler.
"""

from __future__ import annotations

from minillm.engines.continuous import ReservingScheduler
from minillm.scheduler import SchedulerOutput


class IterationLevelScheduler(ReservingScheduler):
    """The continuous engine's scheduler. You write its ``schedule``; the rest is inherited.

    minillm's ``ReservingScheduler`` keeps the queues, the slots and the KV reservations: it checks
    the limits, refuses a request that could never fit, and gives a finished request's reservation
    back. What you can use:

    * ``self.waiting``: a deque of the requests that arrived and are not running, oldest first
      (``self.waiting[0]``; take it with ``self.waiting.popleft()``);
    * ``self.running``: the list of running requests;
    * ``self._admit(request)``: marks a request running, appends it to ``self.running`` and gives
      it a free slot in ``self.slots`` (it does not remove it from ``self.waiting``: you do);
    * ``self.max_num_seqs``: how many requests may run at once (the batch's slots);
    * ``self.num_kv_tokens``: the KV cache capacity in tokens, or ``None`` for no limit;
    * ``self.num_reserved_kv_tokens``: the KV tokens the running requests have reserved (you add
      to it when you admit; ``finish_request`` gives a finished request's tokens back);
    * ``request.max_num_tokens``: the KV tokens a request reserves when admitted (its prompt plus
      ``max_tokens``: room for its longest possible sequence);
    * ``request.num_tokens`` (prompt plus generated so far) and ``request.num_computed_tokens``
      (the tokens already in its KV cache).
    """

    def schedule(self, now: float) -> SchedulerOutput:
        """The plan for the next step (``now``, the engine clock, is not needed here).

        1. Admit: while a request is waiting, a slot is free (fewer than ``max_num_seqs`` running)
           and the *oldest* waiting request's ``max_num_tokens`` still fits in the KV capacity next
           to what is reserved (``num_reserved_kv_tokens + max_num_tokens <= num_kv_tokens``: an
           exact fit is admitted; ``None`` means no limit), take it from ``waiting``, add its
           ``max_num_tokens`` to ``num_reserved_kv_tokens`` and ``_admit`` it. First come, first
           served: stop at the first request that does not fit, even if a younger, smaller one
           would (it must not overtake).
        2. Plan: every running request runs this step, and computes all its tokens not yet in the
           KV cache: a newly admitted request its whole prompt, every other one its one newest
           token (one decode step).

        Return ``SchedulerOutput(scheduled=..., num_scheduled_tokens=..., admitted_ids=...,
        slots=dict(self.slots))``: ``scheduled`` lists the running requests,
        ``num_scheduled_tokens`` maps each one's ``request_id`` to its number of tokens, and
        ``admitted_ids`` lists the ids admitted this step, in admission order.

        Example, two slots, no KV limit, A, B and C waiting with one-token prompts: the first step
        admits A and B and plans ``{A: 1, B: 1}``; C waits. The step after A finishes admits C and
        plans ``{B: 1, C: 1}``.
        """
        raise NotImplementedError("write schedule(): one step's plan, scheduled iteration by iteration")
