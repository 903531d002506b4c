"""Fast-forward: the simulator runs a stretch of identical decode steps at once.

Between two events -- a request finishing, a request arriving -- a step-by-step run often repeats one
plan: every running request decodes one token, nobody is admitted or preempted. A simulated run
knows when the next event comes (every request runs to ``max_tokens``; arrival times are in the
workload), so ``SimEngine`` runs the stretch in one go: the same step times from the cost model, the
same trace rows and token timestamps, but the per-request work done once per stretch instead of
once per step. (vLLM's multi-step scheduling also plans several decode steps at once.)

It is an optimisation, not a model: ``simulate(..., fast_forward=False)`` runs the plain engine loop
step by step and gives identical results. Only a scheduler that says its plan is steady
(``Scheduler.is_steady``) gets it, and only from the class that wrote the ``schedule`` in use: a
subclass with its own ``schedule`` (a learner's exercise) runs step by step unless it opts in too.
"""

from __future__ import annotations

from itertools import islice

from minillm.llm_engine import Engine
from minillm.sim.twins import SIM_TOKEN_ID
from minillm.trace import StepRecord


class SimEngine(Engine):
    """``Engine`` whose ``run_to_completion`` runs steady decode stretches at once (``run``, which
    hands out every token, still goes step by step)."""

    def __init__(self, scheduler, runner, clock, fast_forward: bool = True, block_maps: bool = True):
        super().__init__(scheduler, runner, eos_token_ids=None, clock=clock)
        self.use_fast_forward = fast_forward and trusts_is_steady(scheduler)
        self.record_block_maps = block_maps

    def add_request(self, request) -> None:
        super().add_request(request)
        if SIM_TOKEN_ID in (request.sampling_params.stop_token_ids or ()):
            self.use_fast_forward = False  # it stops at its first token, not at max_tokens

    def run_to_completion(self) -> None:
        """``Engine.run_to_completion``, taking a normal step only where no stretch can be fast-forwarded."""
        while self.has_unfinished_requests():
            self.admit_arrivals()
            if not (self.use_fast_forward and self.fast_forward()):
                self.step(stream=False)

    def fast_forward(self) -> int:
        """Run the steps, from now, that repeat the plan ``schedule`` makes now: until the step that
        gives a request its last token (a normal step finishes it), or the next arrival. Returns how
        many steps ran (0: no steady stretch here, take a normal step)."""
        if not self.scheduler.is_steady():
            return 0
        num_steps = min([r.sampling_params.max_tokens - len(r.output_token_ids) for r in self.scheduler.running]) - 1
        if num_steps < 1:
            return 0
        plan = self.scheduler.schedule(self.clock.now())  # every step's plan, until the stretch ends
        _, num_input_tokens, num_forward_passes = self.runner.step_cost(plan)  # the same every step
        next_arrival = self.next_arrival_time()
        if next_arrival is None:
            next_arrival = float("inf")
        # What Engine._record writes, the same for every row of the stretch (rows share lists, as they
        # share their plan's: nothing changes them).
        no_ids, decode_ids = [], [r.request_id for r in plan.scheduled]
        num_running, num_waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        kv_allocated_tokens, kv_capacity_tokens = self.runner.kv_allocated_tokens(), self.scheduler.kv_capacity_tokens
        end_times = []
        for seconds in islice(self.runner.decode_step_times(plan), num_steps):
            start = self.clock.now()
            if start >= next_arrival:
                break  # the engine admits it before this step, and the plan may change
            self.clock.advance(seconds)
            self.runner.store_decode_kv(plan)
            end = self.clock.now()
            end_times.append(end)
            self.trace.record(
                StepRecord(  # StepRecord's fields in order (keywords would double the row's cost)
                    self.num_steps,
                    start,
                    end,
                    plan.num_scheduled_tokens,
                    no_ids,
                    decode_ids,
                    plan.admitted_ids,
                    plan.preempted_ids,
                    no_ids,  # prefill, decode, ..., finished
                    num_running,
                    num_waiting,
                    self.runner.kv_tokens(),
                    kv_allocated_tokens,
                    kv_capacity_tokens,
                    plan.slots,
                    num_input_tokens,
                    num_forward_passes,
                )
            )
            self.num_steps += 1
        # Engine.update for all the steps at once: a token and its time per request per step.
        tokens = [SIM_TOKEN_ID] * len(end_times)
        for request in plan.scheduled:
            request.num_computed_tokens += len(end_times)
            request.append_output_token_ids(tokens)
            request.metrics.token_times += end_times
        return len(end_times)


def trusts_is_steady(scheduler) -> bool:
    """Whether ``scheduler.is_steady`` describes its ``schedule``: both come from the same class. A
    scheduler without ``is_steady`` (any class that has what the engine uses will do) never does."""
    cls = type(scheduler)
    owner = next((c for c in cls.__mro__ if "is_steady" in vars(c)), None)
    return owner is not None and cls.schedule is owner.schedule
