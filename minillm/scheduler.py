"""Schedulers decide, before every engine step, which requests run and how many tokens each.

Every chapter's engine is a different ``schedule()`` over the same two queues: ``waiting``
(arrived, not running) and ``running`` (holding a batch slot and KV cache).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minillm.request import Request, RequestStatus

DEFAULT_MAX_NUM_SEQS = 8


@dataclass
class SchedulerOutput:
    """The plan for one step (vLLM's name). ``num_scheduled_tokens[rid]`` is the number of tokens
    request ``rid`` computes this step: its whole prompt (or a chunk of it) or one decode token.

    An empty plan means "nothing to run now"; ``wait_until`` then says when the scheduler wants to
    be asked again (a dynamic batcher waiting for its queue delay), else the engine waits for the
    next arrival.

    Build every plan's dicts and lists fresh (or, like ``slots``, replace rather than change them):
    the engine's trace row keeps them as they are, without copying.
    """

    scheduled: list[Request]
    num_scheduled_tokens: dict[str, int]
    admitted_ids: list[str] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    slots: dict[str, int] = field(default_factory=dict)  # request id -> batch slot, for every request holding one
    wait_until: float | None = None

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """The queues and bookkeeping that every policy shares; subclasses implement ``schedule``.

    A request holds one of the batch's slots from admission until it finishes. Slots do not change
    what is computed; they are how the widgets draw a batch (and a padded batch's row numbers).
    ``self.slots`` is replaced, never changed in place, when a request takes or leaves a slot: a
    plan (and the trace row that keeps it) can then hold the dict itself instead of a copy per step.
    """

    kv_capacity_tokens = 0  # the KV cache size in tokens this policy admits against; 0: no limit

    def __init__(self):
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.slots: dict[str, int] = {}

    def check_request(self, request: Request) -> None:
        """Raise ``ValueError`` for a request this policy could never run (called at submission)."""

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float) -> SchedulerOutput:
        """The plan for the next step; ``now`` is the engine clock, in seconds."""
        raise NotImplementedError

    def is_steady(self) -> bool:
        """True when, until a running request finishes or a new one arrives, every step's plan will be
        the one ``schedule`` would make now: each running request decodes one token, nobody is
        admitted or preempted, and ``schedule`` changes nothing. The simulator's fast-forward
        (``minillm.sim.fast_forward``) then runs such a stretch of steps at once. False, the
        default, is always safe: the run goes step by step. The simulator trusts it only from the
        class that also wrote the ``schedule`` in use: a subclass with its own ``schedule`` runs step
        by step unless it writes its own ``is_steady`` too."""
        return False

    def _all_decoding(self) -> bool:
        """Some request is running, and each has its prompt and all but its newest token in the KV cache."""
        return bool(self.running) and all(r.num_computed_tokens == r.num_tokens - 1 >= r.num_prompt_tokens
                                          for r in self.running)

    def finish_request(self, request: Request) -> None:
        """Called by the engine when ``request`` produced its last token."""
        request.status = RequestStatus.FINISHED
        self.running.remove(request)
        slots = dict(self.slots)  # a new dict: earlier plans keep the old one
        del slots[request.request_id]
        self.slots = slots

    def _admit(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        taken = set(self.slots.values())
        slots = dict(self.slots)  # a new dict: earlier plans keep the old one
        slots[request.request_id] = next(s for s in range(len(taken) + 1) if s not in taken)
        self.slots = slots


def plan_running(running: list[Request], slots: dict[str, int], admitted_ids: list[str]) -> SchedulerOutput:
    """Run every running request: each computes its tokens not yet in the KV cache, the whole
    prompt right after admission and one decode token at every later step. (A function, not a
    method of ``Scheduler``: chapter 3's exercise builds on ``Scheduler`` and writes this part itself.)"""
    scheduled = list(running)
    return SchedulerOutput(
        scheduled=scheduled,
        num_scheduled_tokens={r.request_id: r.num_tokens - r.num_computed_tokens for r in scheduled},
        admitted_ids=admitted_ids,
        slots=slots,  # replaced, not changed, when it changes: no copy needed
    )


def check_max_num_seqs(max_num_seqs) -> None:
    if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
