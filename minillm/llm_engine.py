"""The engine loop. Every chapter runs this same loop; only the scheduler and runner change.

One iteration ("step"):
  0. arrivals                       -> requests whose arrival time has come join the scheduler
  1. ``scheduler.schedule(now)``   -> a plan: who runs, how many tokens each (or: nothing yet)
  2. ``runner.execute_model(plan)`` -> the next token of each request whose known tokens are now
                                       all computed, and how many token rows the passes computed
  3. ``update(plan, tokens)``       -> request states, metrics, finished requests
  4. ``trace.record(...)``          -> one row for the widgets and metrics

An ``LLM`` keeps one engine for its whole life: ``reset`` readies it for the next call (a fresh
trace, the clock at 0), and a call that fails or is abandoned ends with ``abort_all_requests``, so
the next one finds every slot and KV block free.
"""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count

from minillm.request import Request, RequestStatus
from minillm.runner import ModelRunnerOutput
from minillm.scheduler import Scheduler, SchedulerOutput
from minillm.trace import StepRecord, Trace


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Keep Python's full garbage collections off the objects that were alive before a run.

    A full collection walks every tracked object; beside torch, a model and a notebook's state it
    takes over a hundred milliseconds on a laptop CPU, and when it falls inside a step, every running
    request's next token waits for it: the longest gap of a stream then measures the collector, not the
    scheduler. ``gc.freeze`` moves those objects where collections do not look (vLLM freezes its heap
    after start-up for this reason, with ``freeze_gc_heap`` [vllm-source-gc-utils]). They are handed
    back after the run, so whatever of them becomes garbage later is still collected."""
    if gc.get_freeze_count():  # frozen already (by an outer run, or by whoever owns this process): theirs
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class RealClock:
    """Seconds since the engine started (or was last reset), from the wall clock. (The simulator
    swaps in a clock that its cost model advances instead.)"""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)


@dataclass
class TokenEvent:
    """One generated token, as streaming hands it out."""

    request_id: str
    token_id: int
    index: int  # 0 for a request's first generated token
    time: float
    finished: bool
    finish_reason: str | None
    text: str = ""  # the new characters this token completes (``LLM.stream`` fills it in)


class Engine:
    """Runs requests to completion with one scheduler and one runner, recording one trace row per step."""

    def __init__(self, scheduler: Scheduler, runner, eos_token_ids: int | Iterable[int] | None, clock=None):
        self.scheduler = scheduler
        self.runner = runner
        self.set_eos_token_ids(eos_token_ids)
        self.clock = clock or RealClock()
        # Only a scheduler with prefix caching on is asked which free blocks are still cached.
        self.prefix_caching = scheduler.enable_prefix_caching
        # The block tables and cached free blocks after each step, for the block-map widgets; a
        # capacity search reads neither (``simulate(..., block_maps=False)``), and they cost it time.
        self.record_block_maps = True
        self.trace = self._new_trace()
        # Submitted, not arrived yet: a heap of (arrival time, submission number, request), so the
        # next arrival is at the top and ties keep their submission order.
        self.pending: list[tuple[float, int, Request]] = []
        self._submitted = count()
        self.num_steps = 0

    def set_eos_token_ids(self, eos_token_ids: int | Iterable[int] | None) -> None:
        """The ids that end a request (``ignore_eos`` aside). One id or several (chat models end a
        turn and the text with different tokens): a set, so the per-token check costs the same."""
        ids = () if eos_token_ids is None else (eos_token_ids,) if isinstance(eos_token_ids, int) else eos_token_ids
        self.eos_token_ids = frozenset(int(t) for t in ids)

    def _new_trace(self) -> Trace:
        trace = Trace()
        trace.num_gpu_blocks = self.scheduler.num_gpu_blocks  # a paged pool, for the block map (else None)
        trace.block_size = self.scheduler.block_size
        self._recorded_cached_free_blocks = None  # a new trace's first row records them, whatever they are
        return trace

    # --- requests in and out ------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Submit ``request``: it joins the scheduler once the clock reaches its arrival time (at
        the next step for one that has already arrived). A request that could never run fails here."""
        self.scheduler.check_request(request)
        heapq.heappush(self.pending, (request.metrics.arrival_time, next(self._submitted), request))

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending) or self.scheduler.has_unfinished_requests()

    def next_arrival_time(self) -> float | None:
        return self.pending[0][0] if self.pending else None

    def abort_request(self, request_id: str, finish_reason: str = "abort") -> bool:
        """Stop an unfinished request now, between steps: a server's client went away, or the
        server found a stop string in its text. The scheduler takes it out of whichever queue holds
        it and frees its slot and KV cache (``finish_requests``); the runner frees its state. False
        when no unfinished request has this id (it finished in the meantime)."""
        i = next((i for i, (_, _, r) in enumerate(self.pending) if r.request_id == request_id), None)
        if i is not None:
            request = self.pending.pop(i)[2]
            heapq.heapify(self.pending)
            request.status, request.finish_reason = RequestStatus.FINISHED, finish_reason
        else:
            ended = self.scheduler.finish_requests(request_id, finish_reason)
            if not ended:
                return False
            request = ended[0]
        request.metrics.finished_time = self.clock.now()
        self.runner.free(request_id)  # its KV cache (host copy if swapped out) and sampling state
        return True

    def abort_all_requests(self, finish_reason: str = "abort") -> int:
        """Abort every unfinished request (pending, waiting, running, swapped): afterwards every slot
        and KV block is free. How many were aborted."""
        ids = [r.request_id for _, _, r in self.pending] + list(self.scheduler.requests)
        return sum(self.abort_request(rid, finish_reason) for rid in ids)

    def reset(self) -> None:
        """Ready for a new run: no request left (any unfinished one is aborted), a fresh trace,
        step 0 and the clock at 0. The KV pool is kept: it is the engine's for its whole life."""
        self.abort_all_requests()
        self.trace = self._new_trace()
        self.num_steps = 0
        self.clock.reset()

    # --- running ------------------------------------------------------------------------------
    def run(self) -> Iterator[TokenEvent]:
        """Step until every request has finished, yielding each token as it is produced."""
        with frozen_heap():
            while self.has_unfinished_requests():
                yield from self.step()

    def run_to_completion(self) -> None:
        """``run`` for callers that want only the finished requests and the trace: no token events
        are built (the simulator replays millions of tokens that nobody watches one by one)."""
        while self.has_unfinished_requests():
            self.step(stream=False)

    def admit_arrivals(self) -> None:
        """Requests whose arrival time has come join the scheduler's waiting queue, in arrival order."""
        now = self.clock.now()
        while self.pending and self.pending[0][0] <= now:
            self.scheduler.add_request(heapq.heappop(self.pending)[2])

    def step(self, stream: bool = True) -> list[TokenEvent]:
        """One iteration. When there is nothing to run, wait on the clock instead: until the next
        arrival, or until the time the scheduler asked for, whichever comes first. Returns the
        step's token events (none when ``stream`` is False)."""
        self.admit_arrivals()
        start = self.clock.now()
        plan = self.scheduler.schedule(start) if self.scheduler.has_unfinished_requests() else None
        if plan is None or plan.is_empty:
            self._wait(plan.wait_until if plan else None)
            return []
        prefill_ids, decode_ids = [], []  # split before update() moves the requests on
        for r in plan.scheduled:
            (decode_ids if r.is_decode else prefill_ids).append(r.request_id)
        output = self.runner.execute_model(plan)
        end = self.clock.now()
        events, finished = self.update(plan, output.sampled_token_ids, start, end, stream)
        self.trace.record(self._record(plan, output, prefill_ids, decode_ids, start, end, finished))
        self.num_steps += 1
        return events

    def _wait(self, wait_until: float | None) -> None:
        """Sleep on the clock until ``wait_until`` or the next arrival, whichever comes first."""
        next_arrival = self.next_arrival_time()
        if next_arrival is not None:
            wait_until = next_arrival if wait_until is None else min(wait_until, next_arrival)
        if wait_until is None:
            raise RuntimeError(
                f"scheduler made no progress at step {self.num_steps} with {len(self.scheduler.waiting)} waiting and "
                f"{len(self.scheduler.running)} running requests"
            )
        self.clock.wait_until(wait_until)

    def update(self, plan: SchedulerOutput, tokens: dict[str, int], start: float, end: float, stream: bool = True):
        """Apply one step's results: progress, new tokens, timestamps and stopping."""
        events, finished = [], []
        num_scheduled_tokens = plan.num_scheduled_tokens
        for request in plan.scheduled:
            m = request.metrics
            if m.first_scheduled_time is None:
                m.first_scheduled_time = start
            request.num_computed_tokens += num_scheduled_tokens[request.request_id]
            token = tokens.get(request.request_id)
            if token is None:
                continue
            request.append_output_token_ids(token)
            m.token_times.append(end)
            if m.first_token_time is None:
                m.first_token_time, m.first_token_step = end, self.num_steps
            reason = self._finish_reason(request, token)
            if reason is not None:
                m.finished_time, m.finished_step = end, self.num_steps
                self.scheduler.finish_requests(request.request_id, reason)  # slot and KV cache back
                self.runner.free(request.request_id)
                finished.append(request.request_id)
            if stream:
                events.append(
                    TokenEvent(
                        request.request_id, token, len(request.output_token_ids) - 1, end, reason is not None, reason
                    )
                )
        return events, finished

    def _finish_reason(self, request: Request, token: int) -> str | None:
        params = request.sampling_params
        if not params.ignore_eos and token in self.eos_token_ids:
            return "stop"
        if params.stop_token_ids and token in params.stop_token_ids:
            return "stop"
        if len(request.output_token_ids) >= params.max_tokens:
            return "length"
        return None

    def _record(
        self,
        plan: SchedulerOutput,
        output: ModelRunnerOutput,
        prefill_ids: list[str],
        decode_ids: list[str],
        start: float,
        end: float,
        finished: list[str],
    ) -> StepRecord:
        # The row keeps the plan's dicts and lists, not copies: a scheduler builds them fresh for
        # every plan (``slots`` it replaces whenever it changes), and nothing changes them afterwards.
        return StepRecord(
            step=self.num_steps,
            start_time=start,
            end_time=end,
            num_scheduled_tokens=plan.num_scheduled_tokens,
            prefill_ids=prefill_ids,
            decode_ids=decode_ids,
            admitted_ids=plan.admitted_ids,
            preempted_ids=plan.preempted_ids,
            finished_ids=finished,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_tokens=self.runner.kv_tokens(),
            kv_allocated_tokens=self.runner.kv_allocated_tokens(),
            kv_capacity_tokens=self.scheduler.kv_capacity_tokens,
            slots=plan.slots,
            num_input_tokens=output.num_input_tokens,
            num_forward_passes=output.num_forward_passes,
            # The paged engine's block tables after the step (None: unchanged) and its swaps.
            block_tables=self.scheduler.changed_block_tables() if self.record_block_maps else None,
            swapped_out_ids=plan.swapped_out_ids,
            cached_free_blocks=self._changed_cached_free_blocks() if self.record_block_maps else None,
        )

    def _changed_cached_free_blocks(self) -> list[int] | None:
        """With prefix caching on: the free blocks still cached, when they changed since the trace
        last recorded them (so rows stay small, as with block tables); otherwise None."""
        if not self.prefix_caching:
            return None
        blocks = self.scheduler.cached_free_blocks()
        if blocks == self._recorded_cached_free_blocks:
            return None
        self._recorded_cached_free_blocks = blocks
        return blocks
