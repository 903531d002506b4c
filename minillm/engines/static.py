"""Chapter 2: static and dynamic batching -- when a batch starts, and how it is laid out.

**Batch formation.** A static batch is formed once and runs until its *longest* request finishes: a
short request's slot sits idle (computing padding) until then, and requests that arrive meanwhile
wait for the whole batch (head-of-line blocking). In exchange, every step reads the weights once
for the whole batch.

*Dynamic* batching (Triton Inference Server's dynamic batcher) only changes when a batch starts: it
waits for a full batch of ``max_num_seqs``, but never longer than ``max_queue_delay`` seconds after
the oldest waiting request arrived -- a bigger batch traded for queueing delay. With
``max_queue_delay=None`` a batch starts as soon as the engine is idle, with whatever has arrived.

**The padded batch.** Prompts have different lengths, but a tensor is a rectangle. *Left* padding
lines every prompt up so that it ends in the same column: then each row's next token is also in the
same column, and a decode step is one ``[B, 1]`` column for the whole batch. The price is compute
spent on padding -- the left pads of short prompts, and every row of a request that has already
finished, because its slot stays in the batch until the longest request is done.

An attention mask keeps the padding invisible: row b's keys before ``pad_lens[b]`` are masked out,
so every real token sees exactly what it would see alone (the naive loop's tokens, up to
floating-point rounding).
"""

from __future__ import annotations

import math
from itertools import islice

import torch

from minillm.attention.padded import PaddedKVCache
from minillm.runner import ModelRunnerBase, ModelRunnerOutput
from minillm.scheduler import DEFAULT_MAX_NUM_SEQS, Scheduler, SchedulerOutput, check_max_num_seqs, plan_running


def form_batch(
    waiting_arrival_times: list[float], now: float, max_num_seqs: int, max_queue_delay: float | None
) -> tuple[int, float | None]:
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
        check_max_queue_delay(max_queue_delay)
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


def check_max_queue_delay(max_queue_delay) -> None:
    if max_queue_delay is not None and not (
        isinstance(max_queue_delay, (int, float)) and math.isfinite(max_queue_delay) and max_queue_delay >= 0
    ):
        raise ValueError(f"max_queue_delay must be None or a number of seconds >= 0, got {max_queue_delay!r}")


PAD_TOKEN_ID = 0  # any id works: a pad's keys are masked out and its outputs are thrown away


def left_pad(batch_token_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lay out a new batch's prompts as ``[B, T]`` tensors, T the longest prompt, each prompt
    right-aligned: ``input_ids`` (pads are ``pad_id``), ``positions`` (0 at each row's first real
    token; pads get 0) and ``mask`` (True on real tokens)."""
    width = max(map(len, batch_token_ids))
    pad_lens = torch.tensor([width - len(ids) for ids in batch_token_ids])
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + list(ids) for ids in batch_token_ids])
    offsets = torch.arange(width) - pad_lens[:, None]  # column minus the row's pad count
    return input_ids, offsets.clamp(min=0), offsets >= 0


class PaddedBatchRunner(ModelRunnerBase):
    """Runs a static batch: the plan's slots are the rows of one padded tensor. The first step of a
    batch prefills all prompts as ``[B, longest prompt]``; every later step is a ``[B, 1]`` decode
    column, finished rows included."""

    def __init__(self, model, device: torch.device):
        super().__init__(model, device)
        self.cache: PaddedKVCache | None = None
        self.live_rows: dict[str, int] = {}  # unfinished request -> its row
        self.pad_lens: list[int] = []  # per row, on the host

    @torch.inference_mode()
    def execute_model(self, plan: SchedulerOutput) -> ModelRunnerOutput:
        if plan.admitted_ids:
            input_ids, positions = self._start_batch(plan)
        else:
            input_ids, positions = self._decode_inputs(plan)
        hidden = self.model(input_ids, positions, self.cache)  # [B, T, hidden]
        self.cache.advance(input_ids.shape[1])
        rows = torch.tensor([plan.slots[r.request_id] for r in plan.scheduled], device=self.device)
        logits = self.model.compute_logits(hidden[rows, -1])  # every scheduled row's last column
        return ModelRunnerOutput(self._sample(plan.scheduled, logits), input_ids.numel(), num_forward_passes=1)

    def left_pad(self, batch_token_ids: list[list[int]], pad_id: int):
        """How a new batch is laid out: ``left_pad`` above (chapter 2's exercise plugs in its own)."""
        return left_pad(batch_token_ids, pad_id)

    def _start_batch(self, plan: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """A new batch (every row is a fresh prompt): left-pad the prompts to the longest one."""
        requests = sorted(plan.scheduled, key=lambda r: plan.slots[r.request_id])
        input_ids, positions, mask = self.left_pad([r.prompt_token_ids for r in requests], PAD_TOKEN_ID)
        pad_lens = (~mask).sum(dim=1)  # the cache keeps the mask as each row's number of leading pads
        self.pad_lens = pad_lens.tolist()
        input_ids, positions, pad_lens = input_ids.to(self.device), positions.to(self.device), pad_lens.to(self.device)
        max_len = input_ids.shape[1] + max(r.sampling_params.max_tokens for r in requests)
        self.cache = PaddedKVCache(self.model.config, pad_lens, max_len, self.dtype, self.device)
        self.live_rows = {r.request_id: plan.slots[r.request_id] for r in requests}
        return input_ids, positions

    def _decode_inputs(self, plan: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """One column: each running row's last token; finished rows compute a pad."""
        tokens = [PAD_TOKEN_ID] * self.cache.batch_size
        for r in plan.scheduled:
            tokens[plan.slots[r.request_id]] = r.output_token_ids[-1]
        input_ids = torch.tensor(tokens, device=self.device)[:, None]
        positions = (self.cache.num_tokens - self.cache.pad_lens)[:, None]
        return input_ids, positions

    def free(self, request_id: str) -> None:
        super().free(request_id)
        self.live_rows.pop(request_id, None)
        if not self.live_rows:
            self.cache = None  # the batch is done

    def kv_tokens(self) -> int:
        if self.cache is None:
            return 0
        return sum(self.cache.num_tokens - self.pad_lens[row] for row in self.live_rows.values())

    def kv_allocated_tokens(self) -> int:
        return 0 if self.cache is None else self.cache.batch_size * self.cache.max_len
