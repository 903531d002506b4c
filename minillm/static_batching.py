"""Chapter 2: static and dynamic batching -- batch formation.

A static batch is formed once and runs until its *longest* request finishes: a short request's slot
sits idle (computing padding) until then, and requests that arrive meanwhile wait for the whole batch
(head-of-line blocking). In exchange, every step reads the weights once for the whole batch.

*Dynamic* batching (Triton Inference Server's dynamic batcher) only changes when a batch starts: it
waits for a full batch of ``max_num_seqs``, but never longer than ``max_queue_delay`` seconds after
the oldest waiting request arrived -- a bigger batch traded for queueing delay. With
``max_queue_delay=None`` a batch starts as soon as the engine is idle, with whatever has arrived.
"""

from __future__ import annotations

import math
from itertools import islice

from minillm.scheduler import DEFAULT_MAX_NUM_SEQS, Scheduler, SchedulerOutput, check_max_num_seqs, plan_running


def form_batch(waiting_arrival_times: list[float], now: float, max_num_seqs: int,
               max_queue_delay: float | None) -> tuple[int, float | None]:
    """``(n, None)``: start a batch of the ``n`` oldest waiting requests now; ``(0, t)``: wait until
    ``t``; ``(0, None)``: nobody is waiting. A batch starts at once when it is full or when there is
    no queue delay, else once the oldest request has waited ``max_queue_delay``."""
    num_waiting = len(waiting_arrival_times)
    if num_waiting == 0:
        return 0, None
    if num_waiting >= max_num_seqs or max_queue_delay is None:
        return min(num_waiting, max_num_seqs), None
    deadline = waiting_arrival_times[0] + max_queue_delay
    return (num_waiting, None) if now >= deadline else (0, deadline)


class StaticBatchScheduler(Scheduler):
    def __init__(self, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, max_queue_delay: float | None = None):
        super().__init__()
        check_max_num_seqs(max_num_seqs)
        if max_queue_delay is not None and not (isinstance(max_queue_delay, (int, float)) and math.isfinite(max_queue_delay)
                                                and max_queue_delay >= 0):
            raise ValueError(f"max_queue_delay must be None or a number of seconds >= 0, got {max_queue_delay!r}")
        self.max_num_seqs = max_num_seqs
        self.max_queue_delay = max_queue_delay
        self.batch_slots: dict[str, int] = {}  # every request of the batch -> its row, finished ones included

    def schedule(self, now: float) -> SchedulerOutput:
        admitted = []
        if not self.running:  # the whole batch has finished: its slots are free
            # Only the oldest max_num_seqs can join the next batch; the decision needs no more.
            arrivals = [r.metrics.arrival_time for r in islice(self.waiting, self.max_num_seqs)]
            num_seqs, wait_until = self.form_batch(arrivals, now)
            if num_seqs == 0:
                return SchedulerOutput(scheduled=[], num_scheduled_tokens={}, wait_until=wait_until)
            batch = [self.waiting.popleft() for _ in range(num_seqs)]
            for request in batch:
                self._admit(request)
            admitted = [r.request_id for r in batch]
            self.batch_slots = {r.request_id: slot for slot, r in enumerate(batch)}
        plan = plan_running(self.running, self.slots, admitted)
        plan.slots = self.batch_slots  # finished rows keep theirs until the whole batch is done
        return plan

    def is_steady(self) -> bool:
        """While a batch runs, nobody joins it: its requests decode a token a step until one finishes."""
        return self._all_decoding()

    def form_batch(self, waiting_arrival_times: list[float], now: float) -> tuple[int, float | None]:
        """When the next batch starts: ``form_batch`` above (chapter 2's exercise plugs in its own)."""
        return form_batch(waiting_arrival_times, now, self.max_num_seqs, self.max_queue_delay)

