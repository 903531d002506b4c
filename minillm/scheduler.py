"""Schedulers decide, before every engine step, which requests run and how many tokens each.

Every chapter's engine is a different ``schedule()`` over the same two queues: ``waiting``
(arrived, not running) and ``running`` (holding a slot and KV cache).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minillm.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """The plan for one step (vLLM's name). ``num_scheduled_tokens[rid]`` is the number of tokens
    request ``rid`` computes this step: its whole prompt (or a chunk of it) or one decode token."""

    scheduled: list[Request]
    num_scheduled_tokens: dict[str, int]
    admitted_ids: list[str] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """The queues and bookkeeping that every policy shares; subclasses implement ``schedule``."""

    def __init__(self):
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        raise NotImplementedError

    def finish_request(self, request: Request) -> None:
        """Called by the engine when ``request`` produced its last token."""
        request.status = RequestStatus.FINISHED
        self.running.remove(request)

    def _admit(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        self.running.append(request)


def tokens_to_compute(request: Request) -> int:
    """The whole rest of the prompt during prefill, else one decode token."""
    return request.num_tokens - request.num_computed_tokens


class NaiveScheduler(Scheduler):
    """Chapter 1: one request at a time, first come first served, run to completion."""

    def schedule(self) -> SchedulerOutput:
        admitted = []
        if not self.running and self.waiting:
            request = self.waiting.popleft()
            self._admit(request)
            admitted.append(request.request_id)
        scheduled = list(self.running)
        return SchedulerOutput(
            scheduled=scheduled,
            num_scheduled_tokens={r.request_id: tokens_to_compute(r) for r in scheduled},
            admitted_ids=admitted,
        )
