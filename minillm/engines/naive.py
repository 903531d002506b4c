"""Chapter 1: the naive loop -- one request at a time, each with its own contiguous KV cache.

The scheduler admits the oldest waiting request once the engine is idle and runs it to completion:
its prefill in one step, then one decode token per step. The runner gives each request a KV cache
sized for its longest possible sequence (``ContiguousKVCache``) and runs one forward pass per
scheduled request: no batching yet. Later chapters change who runs together (``static``,
``continuous``) and how a step's tokens are laid out for the model (``selective``, ``paged``).
"""

from __future__ import annotations

import torch

from minillm.attention.contiguous import ContiguousKVCache
from minillm.models.llama import CausalLM
from minillm.request import Request
from minillm.runner import ModelRunnerBase, ModelRunnerOutput
from minillm.scheduler import Scheduler, SchedulerOutput, plan_running


class NaiveScheduler(Scheduler):
    """Chapter 1: one request at a time, first come first served, run to completion."""

    def schedule(self, now: float) -> SchedulerOutput:
        admitted = []
        if not self.running and self.waiting:
            request = self.waiting.popleft()
            self._admit(request)
            admitted.append(request.request_id)
        return plan_running(self.running, self.slots, admitted)

    def is_steady(self) -> bool:
        """While a request runs, nobody is admitted: it decodes a token a step until it finishes."""
        return self._all_decoding()


class ModelRunner(ModelRunnerBase):
    """One contiguous KV cache per request, sized for its longest possible sequence, and one
    forward pass per scheduled request."""

    def __init__(self, model: CausalLM, device: torch.device):
        super().__init__(model, device)
        self.kv_caches: dict[str, ContiguousKVCache] = {}

    @torch.inference_mode()
    def execute_model(self, plan: SchedulerOutput) -> ModelRunnerOutput:
        """Run every scheduled request's tokens; sample for each request whose known tokens are now
        all computed (a partial prompt chunk samples nothing)."""
        sampled, logits = [], []
        for request in plan.scheduled:
            n = plan.num_scheduled_tokens[request.request_id]
            hidden = self._forward_one(request, n)
            if request.num_computed_tokens + n == request.num_tokens:
                sampled.append(request)
                logits.append(self.model.compute_logits(hidden[-1:]))
        tokens = self._sample(sampled, torch.cat(logits) if logits else None)
        return ModelRunnerOutput(tokens, plan.total_num_scheduled_tokens, len(plan.scheduled))

    def _forward_one(self, request: Request, n: int) -> torch.Tensor:
        cache = self._cache(request)
        start = request.num_computed_tokens
        ids = torch.tensor(request.token_ids_slice(start, start + n), device=self.device)
        positions = torch.arange(start, start + n, device=self.device)
        hidden = self.model(ids, positions, cache)
        cache.advance(n)
        return hidden

    def _cache(self, request: Request) -> ContiguousKVCache:
        cache = self.kv_caches.get(request.request_id)
        if cache is None:
            cache = ContiguousKVCache(self.model.config, request.max_num_tokens, self.dtype, self.device)
            self.kv_caches[request.request_id] = cache
        return cache

    def free(self, request_id: str) -> None:
        super().free(request_id)
        self.kv_caches.pop(request_id, None)

    def kv_tokens(self) -> int:
        return sum(c.num_tokens for c in self.kv_caches.values())

    def kv_allocated_tokens(self) -> int:
        return sum(c.max_len for c in self.kv_caches.values())


@torch.inference_mode()
def greedy_decode_loop(model: CausalLM, prompt_token_ids: list[int], max_tokens: int, eos_token_id=None) -> list[int]:
    """Chapter 1's loop with no engine around it: one cache for the whole sequence, one prefill over
    the prompt, then one decode step per token (the last token, at the next position), greedy. What
    the engine's scheduling, sampling and trace cost per step is measured against it."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    cache = ContiguousKVCache(model.config, len(prompt_token_ids) + max_tokens, dtype, device)
    ids, output = torch.tensor(prompt_token_ids, device=device), []
    while len(output) < max_tokens:
        positions = torch.arange(cache.num_tokens, cache.num_tokens + len(ids), device=device)
        hidden = model(ids, positions, cache)
        cache.advance(len(ids))
        output.append(int(model.compute_logits(hidden[-1:]).argmax(dim=-1)))
        if output[-1] == eos_token_id:
            break
        ids = torch.tensor(output[-1:], device=device)
    return output
