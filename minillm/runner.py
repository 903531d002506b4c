"""The model runner executes a step plan on the real model and returns the sampled tokens.

Chapter 1's runner gives each request its own contiguous KV cache and runs the scheduled requests
one forward pass each: no batching yet. Later chapters change how the tokens of a step are laid out
for the model (a padded batch, one flat token batch) and keep the rest of this file.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.attention.contiguous import ContiguousKVCache
from minillm.model import CausalLM
from minillm.request import Request
from minillm.sampler import sample
from minillm.scheduler import SchedulerOutput


@dataclass
class ModelRunnerOutput:
    """What one step computed (vLLM's name)."""

    sampled_token_ids: dict[str, int]  # request id -> next token, for each request whose known tokens are all computed
    num_input_tokens: int  # token rows the forward passes computed, padding included (vLLM's name)
    num_forward_passes: int


class ModelRunnerBase:
    """What every runner shares: the model, and sampling with one seeded generator per request, so
    a request samples the same tokens however it is batched."""

    def __init__(self, model: CausalLM, device: torch.device):
        self.model = model
        self.device = device
        self.dtype = next(model.parameters()).dtype
        self.generators: dict[str, torch.Generator] = {}

    def execute_model(self, plan: SchedulerOutput) -> ModelRunnerOutput:
        raise NotImplementedError

    def _sample(self, requests: list[Request], logits: torch.Tensor) -> dict[str, int]:
        """One row of ``logits`` per request -> ``{request_id: token}``; the step's one host sync."""
        if not requests:
            return {}
        tokens = sample(logits, [r.sampling_params for r in requests], [self._generator(r) for r in requests])
        return dict(zip((r.request_id for r in requests), tokens.tolist()))

    def _generator(self, request: Request) -> torch.Generator:
        g = self.generators.get(request.request_id)
        if g is None:
            g = torch.Generator(device=self.device).manual_seed(request.seed)
            self.generators[request.request_id] = g
        return g

    def free(self, request_id: str) -> None:
        """Release a finished request's sampling state (and, in subclasses, its KV cache)."""
        self.generators.pop(request_id, None)

    def kv_tokens(self) -> int:
        """Tokens whose keys and values the running requests hold."""
        raise NotImplementedError

    def kv_allocated_tokens(self) -> int:
        """KV memory allocated, in tokens: held tokens plus room reserved for future ones and padding."""
        raise NotImplementedError


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
