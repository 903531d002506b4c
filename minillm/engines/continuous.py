"""Chapter 3: iteration-level scheduling (Orca), also called continuous batching.

A static batch is formed once per batch; Orca schedules once per *step*. Between any two steps,
requests that finished leave the batch and waiting requests take their slots, so a short request
never holds a slot it no longer needs and a new arrival waits for one step, not for a whole batch.

Each running request keeps a contiguous KV cache reserved for its longest possible sequence
(prompt + ``max_tokens``), so admission is limited twice: by ``max_num_seqs`` slots and by the KV
capacity, ``num_kv_tokens`` (``None``: no limit). Reserving for tokens that may never be generated is the waste that
chapter 5's paged cache removes.

The runner batches what is easy to batch: all decode tokens of a step run as one ``[B]`` batch
(one token per request). A newly admitted prompt runs in a pass of its own, because prompts of
different lengths do not stack into one tensor without padding -- chapter 4 removes that last pass.
"""

from __future__ import annotations

import torch

from minillm.attention.decode_batch import DecodeBatchKVCache
from minillm.engines.naive import ModelRunner
from minillm.request import Request
from minillm.runner import ModelRunnerOutput
from minillm.scheduler import DEFAULT_MAX_NUM_SEQS, Scheduler, SchedulerOutput, check_max_num_seqs, plan_running


class ReservingScheduler(Scheduler):
    """A scheduler that admits up to ``max_num_seqs`` requests and reserves, for each running one,
    a KV cache for its longest possible sequence (``request.max_num_tokens``) out of
    ``num_kv_tokens`` (``None``: no limit).

    It holds the bookkeeping only: the limits, the reservation a finished request gives back, and
    the refusal of a request that could never fit. Deciding whom to admit and what to run
    (``schedule``) is left to subclasses: the continuous engine's ``ContinuousBatchScheduler`` and
    chapter 3's exercise, which must not find its answer here."""

    def __init__(self, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, num_kv_tokens: int | None = None):
        super().__init__()
        check_max_num_seqs(max_num_seqs)
        check_num_kv_tokens(num_kv_tokens)
        self.max_num_seqs = max_num_seqs
        self.num_kv_tokens = num_kv_tokens
        self.num_reserved_kv_tokens = 0  # reserved by the running requests

    @property
    def kv_capacity_tokens(self) -> int:
        """The capacity the engine's trace records (0: no limit)."""
        return self.num_kv_tokens or 0

    def check_request(self, request: Request) -> None:
        """A request that would not fit even in an empty cache fails at submission: it would
        otherwise wait forever."""
        if self.num_kv_tokens is not None and request.max_num_tokens > self.num_kv_tokens:
            raise ValueError(
                f"request {request.request_id}: {request.num_prompt_tokens} prompt tokens + max_tokens="
                f"{request.sampling_params.max_tokens} needs {request.max_num_tokens} KV cache tokens, more than "
                f"num_kv_tokens={self.num_kv_tokens}"
            )

    @property
    def kv_cache_usage(self) -> float:
        """The tokens reserved over the capacity (0 with no limit)."""
        return self.num_reserved_kv_tokens / self.num_kv_tokens if self.num_kv_tokens else 0.0

    def free_request(self, request: Request) -> None:
        """A running request also gives its KV reservation back."""
        if request in self.running:
            self.num_reserved_kv_tokens -= request.max_num_tokens
        super().free_request(request)


def check_num_kv_tokens(num_kv_tokens) -> None:
    if num_kv_tokens is not None and (
        isinstance(num_kv_tokens, bool) or not isinstance(num_kv_tokens, int) or num_kv_tokens < 1
    ):
        raise ValueError(f"num_kv_tokens must be None (no limit) or an integer >= 1, got {num_kv_tokens!r}")


class ContinuousBatchScheduler(ReservingScheduler):
    """Orca's policy: admit in arrival order at every step, run every running request."""

    def schedule(self, now: float) -> SchedulerOutput:
        """Admit waiting requests in arrival order while a slot and their KV reservation are free,
        then run every running request: a new one's whole prompt, the others one decode token."""
        admitted = []
        while self.waiting and len(self.running) < self.max_num_seqs and self._kv_fits(self.waiting[0]):
            request = self.waiting.popleft()
            self.num_reserved_kv_tokens += request.max_num_tokens
            self._admit(request)
            admitted.append(request.request_id)
        return plan_running(self.running, self.slots, admitted)

    def is_steady(self) -> bool:
        """Every running request decodes, and the oldest waiting request (if any) cannot be admitted:
        no slot or KV reservation frees up until a request finishes, so neither can it later, nor a
        younger one that arrives after it."""
        can_admit = self.waiting and len(self.running) < self.max_num_seqs and self._kv_fits(self.waiting[0])
        return not can_admit and self._all_decoding()

    def _kv_fits(self, request: Request) -> bool:
        return self.num_kv_tokens is None or self.num_reserved_kv_tokens + request.max_num_tokens <= self.num_kv_tokens


class ContinuousBatchRunner(ModelRunner):
    """One pass per new prompt, then one pass for all decode tokens together."""

    @torch.inference_mode()
    def execute_model(self, plan: SchedulerOutput) -> ModelRunnerOutput:
        prefills = [r for r in plan.scheduled if not r.is_decode]
        decodes = [r for r in plan.scheduled if r.is_decode]
        sampled, logits = [], []
        for request in prefills:
            n = plan.num_scheduled_tokens[request.request_id]
            hidden = self._forward_one(request, n)
            if request.num_computed_tokens + n == request.num_tokens:
                sampled.append(request)
                logits.append(self.model.compute_logits(hidden[-1:]))
        if decodes:
            ids = torch.tensor(
                [r.output_token_ids[-1] for r in decodes], device=self.device
            )  # the one token not yet in the cache
            positions = torch.tensor([r.num_computed_tokens for r in decodes], device=self.device)
            attn = DecodeBatchKVCache([self._cache(r) for r in decodes])
            hidden = self.model(ids, positions, attn)  # [B, hidden]
            attn.advance()
            sampled += decodes
            logits.append(self.model.compute_logits(hidden))
        tokens = self._sample(sampled, torch.cat(logits) if logits else None)
        return ModelRunnerOutput(tokens, plan.total_num_scheduled_tokens, len(prefills) + bool(decodes))
