"""The engine loop. Every chapter runs this same loop; only the scheduler and runner change.

One iteration ("step"):
  1. ``scheduler.schedule(now)``   -> a plan: who runs, how many tokens each (or: nothing yet)
  2. ``runner.execute_model(plan)`` -> the next token of each request whose known tokens are now
                                       all computed, and how many token rows the passes computed
  3. ``update(plan, tokens)``       -> request states, metrics, finished requests
  4. ``trace.record(...)``          -> one row for the widgets and metrics
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Iterator

from minillm.request import Request, RequestStatus
from minillm.runner import ModelRunnerOutput
from minillm.scheduler import Scheduler, SchedulerOutput
from minillm.trace import StepRecord, Trace


class RealClock:
    """Seconds since the engine started, from the wall clock. (The simulator swaps in a clock
    that its cost model advances instead.)"""

    def __init__(self):
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

    def __init__(self, scheduler: Scheduler, runner, eos_token_id: int | Iterable[int] | None, clock=None):
        self.scheduler = scheduler
        self.runner = runner
        self.eos_token_id = eos_token_id
        # One id or several (chat models end a turn and the text with different tokens): a set, so
        # the per-token check costs the same either way.
        ids = () if eos_token_id is None else (eos_token_id,) if isinstance(eos_token_id, int) else eos_token_id
        self.eos_token_ids = frozenset(int(t) for t in ids)
        self.clock = clock or RealClock()
        self.trace = Trace()
        # A paged scheduler describes its pool for the trace (the block-map widget draws it).
        self.trace.num_gpu_blocks = getattr(scheduler, "num_gpu_blocks", None)
        self.trace.block_size = getattr(scheduler, "block_size", None)
        self.pending: list[Request] = []  # submitted, not arrived yet; sorted latest first in run()
        self.num_steps = 0

    def add_request(self, request: Request) -> None:
        self.scheduler.check_request(request)  # a request that could never run fails at submission
        self.pending.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending) or self.scheduler.has_unfinished_requests()

    def abort_request(self, request_id: str, finish_reason: str = "abort") -> bool:
        """Stop an unfinished request now, between steps: a server's client went away, or the
        server found a stop string in its text. It leaves whichever queue holds it (pending,
        waiting, running, or a paged scheduler's ``swapped``); a running one gives back its slot
        and KV cache through ``finish_request``, as if it had finished, and the runner frees its
        state. False when no unfinished request has this id (it finished in the meantime)."""
        request = next((r for r in self.pending if r.request_id == request_id), None)
        if request is not None:
            self.pending.remove(request)
        else:
            queues = (self.scheduler.waiting, getattr(self.scheduler, "swapped", ()))
            request = next((r for q in (self.scheduler.running, *queues) for r in q if r.request_id == request_id), None)
            if request is None:
                return False
            if request in self.scheduler.running:
                self.scheduler.finish_request(request)  # slot, KV reservation or blocks back
            else:  # not running: it holds no slot, and (preempted) no blocks either
                next(q for q in queues if request in q).remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = finish_reason
        request.metrics.finished_time = self.clock.now()
        self.runner.free(request_id)  # its KV cache (host copy if swapped out) and sampling state
        return True

    def run(self) -> Iterator[TokenEvent]:
        """Step until every request has finished, yielding each token as it is produced."""
        self._sort_pending()
        while self.has_unfinished_requests():
            self._admit_arrivals()
            yield from self.step()

    def run_to_completion(self) -> None:
        """``run`` for callers that want only the finished requests and the trace: no token events
        are built (the simulator replays millions of tokens that nobody watches one by one)."""
        self._sort_pending()
        while self.has_unfinished_requests():
            self._admit_arrivals()
            self.step(stream=False)

    def _sort_pending(self) -> None:
        self.pending.sort(key=lambda r: r.metrics.arrival_time)
        self.pending.reverse()  # next arrival last, ties in submission order

    def _admit_arrivals(self) -> None:
        now = self.clock.now()
        while self.pending and self.pending[-1].metrics.arrival_time <= now:
            self.scheduler.add_request(self.pending.pop())

    def step(self, stream: bool = True) -> list[TokenEvent]:
        """One iteration. When there is nothing to run, wait on the clock instead: until the next
        arrival, or until the time the scheduler asked for, whichever comes first. Returns the
        step's token events (none when ``stream`` is False)."""
        start = self.clock.now()
        plan = self.scheduler.schedule(start) if self.scheduler.has_unfinished_requests() else None
        if plan is None or plan.is_empty:
            self._wait(plan.wait_until if plan else None)
            return []
        prefill_ids, decode_ids = [], []  # split before update() moves the requests on
        for r in plan.scheduled:
            (prefill_ids if r.is_prefill else decode_ids).append(r.request_id)
        output = self.runner.execute_model(plan)
        end = self.clock.now()
        events, finished = self.update(plan, output.sampled_token_ids, start, end, stream)
        self.trace.record(self._record(plan, output, prefill_ids, decode_ids, start, end, finished))
        self.num_steps += 1
        return events

    def _wait(self, wait_until: float | None) -> None:
        """Sleep on the clock until ``wait_until`` or the next arrival, whichever comes first."""
        if self.pending:
            next_arrival = self.pending[-1].metrics.arrival_time
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
                request.finish_reason = reason
                m.finished_time, m.finished_step = end, self.num_steps
                self.scheduler.finish_request(request)
                self.runner.free(request.request_id)
                finished.append(request.request_id)
            if stream:
                events.append(TokenEvent(request.request_id, token, len(request.output_token_ids) - 1, end, reason is not None, reason))
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

    def _record(self, plan: SchedulerOutput, output: ModelRunnerOutput, prefill_ids: list[str], decode_ids: list[str],
                start: float, end: float, finished: list[str]) -> StepRecord:
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
            block_tables=self._changed_block_tables(),
            swapped_out_ids=getattr(plan, "swapped_out_ids", []),
        )

    def _changed_block_tables(self) -> dict[str, list[int]] | None:
        changed = getattr(self.scheduler, "changed_block_tables", None)
        return changed() if changed is not None else None
