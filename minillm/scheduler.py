"""The scheduler's side of the loop: before every engine step, a scheduler decides which requests
run and how many tokens each.

``Scheduler`` declares everything the loop (``minillm.llm_engine``), ``LLM`` and the server call on a
scheduler, with defaults; every chapter's engine (``minillm.engines``) is a different ``schedule()``
over the same two queues, ``waiting`` (arrived, not running) and ``running`` (holding a batch slot
and KV cache), and ``SchedulerOutput`` is the plan it hands the runner.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
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
    swapped_out_ids: list[str] = field(default_factory=list)  # preempted to host memory (also in preempted_ids)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """The interface the engine loop calls, with the defaults and bookkeeping every policy shares;
    a policy writes ``schedule`` (and overrides what its KV layout adds).

    The loop calls only what is declared here (``SCHEDULER_CONTRACT`` in ``minillm.engines`` lists
    it), never probes for more: a plug-in that extends nothing must have all of it.

    Requests in, requests out:
      ``check_request``   refuse a request this policy could never run (at submission)
      ``add_request``     an arrived request joins ``waiting``
      ``schedule``        the plan for the next step (the policy)
      ``finish_requests`` end requests wherever they are, giving back their slot and KV
                          (vLLM's name: the loop calls it when a request is done, the server on aborts)
    What the loop, ``llm.stats()`` and ``/metrics`` read:
      ``waiting``, ``running``, ``requests``, ``has_unfinished_requests()``, ``stats()``,
      ``kv_capacity_tokens``, and for the block map ``num_gpu_blocks``, ``block_size`` and
      ``changed_block_tables()`` (None here: no blocks), and ``enable_prefix_caching`` (False
      here): only a scheduler that has it set (the paged ones' option) is also asked
      ``cached_free_blocks()`` and ``reset_prefix_cache()``.

    A request holds one of the batch's slots from admission until it finishes. Slots do not change
    what is computed; they are how the widgets draw a batch (and a padded batch's row numbers).
    ``self.slots`` is replaced, never changed in place, when a request takes or leaves a slot: a
    plan (and the trace row that keeps it) can then hold the dict itself instead of a copy per step.
    """

    kv_capacity_tokens = 0  # the KV cache size in tokens this policy admits against; 0: no limit
    num_gpu_blocks: int | None = None  # a paged policy's pool (the trace's block map): blocks ...
    block_size: int | None = None  # ... of this many tokens
    enable_prefix_caching = False  # the paged policies' option: their free blocks may still hold cached tokens

    def __init__(self):
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.slots: dict[str, int] = {}
        self.requests: dict[str, Request] = {}  # every unfinished request, by id (vLLM's name)

    # --- requests in and out ----------------------------------------------------------------
    def check_request(self, request: Request) -> None:
        """Raise ``ValueError`` for a request this policy could never run (called at submission)."""

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def finish_requests(self, request_ids: str | Iterable[str], finish_reason: str) -> list[Request]:
        """End the unfinished requests among ``request_ids``, wherever they are (running, waiting, or
        a subclass's own queue): each gives back what it holds (``free_request``) and is marked
        finished with ``finish_reason``. Ids of requests already finished are skipped. Returns the
        requests it ended."""
        ids = [request_ids] if isinstance(request_ids, str) else request_ids
        ended = []
        for request_id in ids:
            request = self.requests.pop(request_id, None)
            if request is None:
                continue
            self.free_request(request)
            request.status = RequestStatus.FINISHED
            request.finish_reason = finish_reason
            ended.append(request)
        return ended

    def free_request(self, request: Request) -> None:
        """Take ``request`` out of the queue that holds it and give back its slot. Subclasses also
        give back its KV cache (a reservation, blocks)."""
        if request in self.running:
            self.running.remove(request)
            self.release_slot(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # --- one step ----------------------------------------------------------------------------
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

    # --- what is read about it -----------------------------------------------------------------
    @property
    def kv_cache_usage(self) -> float:
        """The fraction of the KV cache in use, 0-1 (vLLM's ``kv_cache_usage``); 0 with no limit."""
        return 0.0

    def stats(self) -> dict:
        """The scheduler now: requests running and waiting, KV cache use, and what the policy adds
        (the paged pool's blocks, preemptions so far)."""
        return {
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "kv_cache_usage": self.kv_cache_usage,
        }

    def changed_block_tables(self) -> dict[str, list[int]] | None:
        """Every request's block table now, or None when none changed since the last call (what the
        trace records after each step). None here: no blocks."""
        return None

    # --- for subclasses ----------------------------------------------------------------------
    def _all_decoding(self) -> bool:
        """Some request is running, and each decodes (``Request.is_decode``)."""
        return bool(self.running) and all(r.is_decode for r in self.running)

    def _admit(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        taken = set(self.slots.values())
        slots = dict(self.slots)  # a new dict: earlier plans keep the old one
        slots[request.request_id] = next(s for s in range(len(taken) + 1) if s not in taken)
        self.slots = slots

    def release_slot(self, request: Request) -> None:
        """``request``'s batch slot is free for the next admission."""
        slots = dict(self.slots)  # a new dict: earlier plans keep the old one
        del slots[request.request_id]
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
    check_count("max_num_seqs", max_num_seqs)


def check_count(name: str, value, least: int = 1) -> None:
    """A ValueError naming option ``name`` unless ``value`` is an integer >= ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def check_flag(name: str, value) -> None:
    """A ValueError naming option ``name`` unless ``value`` is True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
