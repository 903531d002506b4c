"""Simulated model runners: they compute nothing, and advance the clock by what the real runner's
forward passes would cost.

Each real runner lays a step's tokens out differently, and the layout decides the cost: one pass per
request reads the weights once per request; a padded batch computes its padding like real tokens; a
flat token batch reads the weights once for everyone. So each real runner has a simulated twin that
builds the same passes, as shapes only, and asks the cost model for their time.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

from minillm.engines.continuous import ContinuousBatchRunner
from minillm.engines.naive import ModelRunner
from minillm.engines.paged import PagedRunner
from minillm.engines.selective import SelectiveBatchRunner
from minillm.engines.static import PaddedBatchRunner
from minillm.request import Request
from minillm.runner import ModelRunnerOutput
from minillm.scheduler import SchedulerOutput
from minillm.sim.clock import SimClock
from minillm.sim.cost_model import Profile, attention_pairs

# The token every simulated request generates. It is no real token: the simulator knows lengths,
# not text, so EOS and stop tokens never fire and every request runs to ``max_tokens``.
SIM_TOKEN_ID = -1


class SimRunner:
    """What the simulated runners share: the real runners' interface (``execute_model``, ``free``,
    ``kv_tokens``, ``kv_allocated_tokens``), advancing the clock, the placeholder tokens, and the KV
    bookkeeping of one contiguous cache per request sized for its longest possible sequence (as
    ``ModelRunner`` keeps it)."""

    def __init__(self, profile: Profile, clock: SimClock):
        self.profile = profile
        self.clock = clock
        self.requests: dict[str, Request] = {}  # requests holding a KV cache
        self.num_kv_tokens = 0
        self.num_kv_allocated = 0

    def execute_model(self, plan: SchedulerOutput) -> ModelRunnerOutput:
        seconds, num_input_tokens, num_passes = self.step_cost(plan)
        self.clock.advance(seconds)
        self.store_kv(plan)
        tokens = plan.num_scheduled_tokens
        sampled = {  # one token for each request whose known tokens are now all computed
            r.request_id: SIM_TOKEN_ID
            for r in plan.scheduled
            if r.num_computed_tokens + tokens[r.request_id] == r.num_tokens
        }
        return ModelRunnerOutput(sampled, num_input_tokens, num_passes)

    def step_cost(self, plan: SchedulerOutput) -> tuple[float, int, int]:
        """``(seconds, token rows computed, forward passes)`` of the step."""
        raise NotImplementedError

    def decode_step_times(self, plan: SchedulerOutput) -> Iterator[float]:
        """The fast-forward's ``step_cost`` (``minillm.sim.fast_forward``): the seconds of each step
        of a stretch that runs ``plan`` again and again, every request decoding one token a step."""
        raise NotImplementedError

    def store_kv(self, plan: SchedulerOutput) -> None:
        for r in plan.scheduled:
            if r.request_id not in self.requests:
                self.requests[r.request_id] = r
                self.num_kv_allocated += r.max_num_tokens
        self.num_kv_tokens += plan.total_num_scheduled_tokens

    def store_decode_kv(self, plan: SchedulerOutput) -> None:
        """``store_kv`` of a decode step whose requests all hold their cache already."""
        self.num_kv_tokens += len(plan.scheduled)

    def free(self, request_id: str) -> None:
        r = self.requests.pop(request_id)
        self.num_kv_tokens -= r.num_computed_tokens
        self.num_kv_allocated -= r.max_num_tokens

    def kv_tokens(self) -> int:
        return self.num_kv_tokens

    def kv_allocated_tokens(self) -> int:
        return self.num_kv_allocated


class SimPerRequestRunner(SimRunner):
    """Twin of ``ModelRunner``: one forward pass per scheduled request, each reading all weights."""

    def step_cost(self, plan):
        seconds = 0.0
        for r in plan.scheduled:
            n, c = plan.num_scheduled_tokens[r.request_id], r.num_computed_tokens
            seconds += self.profile.forward_time(1, n, c + n, attention_pairs(c, n))
        return seconds, plan.total_num_scheduled_tokens, len(plan.scheduled)

    def decode_step_times(self, plan):
        contexts = [r.num_computed_tokens + 1 for r in plan.scheduled]  # the new token attends to c + 1 keys
        for grown in count():  # each step, every context is one token longer
            seconds = 0.0
            for context in contexts:
                seconds += self.profile.forward_time(1, 1, context + grown, context + grown)
            yield seconds


class SimFlatBatchRunner(SimRunner):
    """Twin of ``SelectiveBatchRunner``: every scheduled token in one flat pass."""

    def step_cost(self, plan):
        num_tokens = context = pairs = 0
        for r in plan.scheduled:
            n, c = plan.num_scheduled_tokens[r.request_id], r.num_computed_tokens
            num_tokens += n
            context += c + n
            pairs += attention_pairs(c, n)
        return self.profile.forward_time(len(plan.scheduled), num_tokens, context, pairs), num_tokens, 1

    def decode_step_times(self, plan):
        b = len(plan.scheduled)
        first = sum(r.num_computed_tokens + 1 for r in plan.scheduled)  # context = attention pairs, as in step_cost
        for context in count(first, b):  # each step, every request's context is one token longer
            yield self.profile.forward_time(b, b, context, context)


class SimContinuousBatchRunner(SimRunner):
    """Twin of ``ContinuousBatchRunner``: a pass per new prompt, one pass for all decode tokens."""

    def step_cost(self, plan):
        seconds, num_passes = 0.0, 0
        num_decodes = decode_context = 0  # the decode pass: its sequences, and their cached + new tokens
        for r in plan.scheduled:
            c = r.num_computed_tokens
            if not r.is_decode:
                n = plan.num_scheduled_tokens[r.request_id]
                seconds += self.profile.forward_time(1, n, c + n, attention_pairs(c, n))
                num_passes += 1
            else:
                num_decodes += 1
                decode_context += c + 1
        if num_decodes:
            # One new token after c cached ones attends to c + 1 keys (attention_pairs(c, 1)), so
            # the pass's attention pairs add up to its context.
            seconds += self.profile.forward_time(num_decodes, num_decodes, decode_context, decode_context)
            num_passes += 1
        return seconds, plan.total_num_scheduled_tokens, num_passes

    decode_step_times = SimFlatBatchRunner.decode_step_times  # no prefill: the one decode pass is a flat pass


class SimPaddedBatchRunner(SimRunner):
    """Twin of ``PaddedBatchRunner``: a static batch as one ``[B, T]`` rectangle. Every row pays for
    every column -- left pads, and rows whose request already finished -- and the batch's KV cache is
    one ``[B, longest prompt + longest max_tokens]`` block."""

    def __init__(self, profile: Profile, clock: SimClock):
        super().__init__(profile, clock)
        self.num_rows = 0
        self.prompt_width = 0  # the longest prompt of the batch: the prefill's number of columns
        self.num_columns = 0  # columns computed so far in this batch, left pads included
        self.max_columns = 0
        self.pad_lens: dict[str, int] = {}  # unfinished request -> its row's left padding
        self.num_pad_tokens = 0  # their sum, kept up to date rather than summed every step

    def step_cost(self, plan):
        if plan.admitted_ids:  # a new batch: prefill every prompt, left-padded to the longest
            self._start_batch(plan)
        b, c, t = self.num_rows, self.num_columns, self._new_columns(plan)
        return self.profile.forward_time(b, b * t, b * (c + t), b * attention_pairs(c, t)), b * t, 1

    def _start_batch(self, plan):
        self.prompt_width = max(r.num_prompt_tokens for r in plan.scheduled)
        self.num_rows, self.num_columns = len(plan.slots), 0
        self.max_columns = self.prompt_width + max(r.sampling_params.max_tokens for r in plan.scheduled)
        self.pad_lens = {r.request_id: self.prompt_width - r.num_prompt_tokens for r in plan.scheduled}
        self.num_pad_tokens = sum(self.pad_lens.values())

    def _new_columns(self, plan) -> int:
        return self.prompt_width if plan.admitted_ids else 1

    def decode_step_times(self, plan):
        b = self.num_rows
        for c in count(self.num_columns):  # one more column a step
            yield self.profile.forward_time(b, b, b * (c + 1), b * attention_pairs(c, 1))

    def store_kv(self, plan):
        self.num_columns += self._new_columns(plan)

    def store_decode_kv(self, plan):
        self.num_columns += 1

    def free(self, request_id):
        self.num_pad_tokens -= self.pad_lens.pop(request_id)

    def kv_tokens(self):
        return len(self.pad_lens) * self.num_columns - self.num_pad_tokens  # unfinished rows, pads excluded

    def kv_allocated_tokens(self):
        return self.num_rows * self.max_columns if self.pad_lens else 0


class SimPagedRunner(SimFlatBatchRunner):
    """Twin of ``PagedRunner``: the same flat pass; the KV memory counted by blocks held, as the
    plan's block tables say (the scheduler and its ``BlockManager`` are the real ones). A steady
    decode stretch still allocates blocks, so the paged scheduler is never fast-forwarded. The chunked
    engine runs the paged runner, so this is its twin too: a chunk is ``n`` tokens after ``c`` cached."""

    def __init__(self, profile: Profile, clock: SimClock):
        super().__init__(profile, clock)
        self.tokens_held: dict[str, int] = {}
        self.blocks_held: dict[str, int] = {}
        self.block_size = 0

    def store_kv(self, plan):
        self.block_size = plan.block_size
        for rid in plan.preempted_ids:
            self.tokens_held.pop(rid, None)
            self.blocks_held.pop(rid, None)
        for r in plan.scheduled:
            self.tokens_held[r.request_id] = r.num_computed_tokens + plan.num_scheduled_tokens[r.request_id]
            self.blocks_held[r.request_id] = len(plan.block_tables[r.request_id])

    def free(self, request_id):
        self.tokens_held.pop(request_id, None)
        self.blocks_held.pop(request_id, None)

    def kv_tokens(self):
        return sum(self.tokens_held.values())

    def kv_allocated_tokens(self):
        return sum(self.blocks_held.values()) * self.block_size


# Each real runner's simulated twin.
SIM_RUNNERS = {
    ModelRunner: SimPerRequestRunner,
    ContinuousBatchRunner: SimContinuousBatchRunner,
    SelectiveBatchRunner: SimFlatBatchRunner,
    PaddedBatchRunner: SimPaddedBatchRunner,
    PagedRunner: SimPagedRunner,  # the paged and chunked engines' runner
}
