"""The model runner executes a step plan on the real model and returns the sampled tokens.

Chapter 1's runner gives each request its own contiguous KV cache and runs the scheduled requests
one forward pass each: no batching yet.
"""

from __future__ import annotations

import torch

from minillm.kv_cache import ContiguousKVCache
from minillm.model import CausalLM
from minillm.request import Request
from minillm.sampler import sample
from minillm.scheduler import SchedulerOutput


class ModelRunner:
    def __init__(self, model: CausalLM, device: torch.device):
        self.model = model
        self.device = device
        self.dtype = next(model.parameters()).dtype
        self.kv_caches: dict[str, ContiguousKVCache] = {}
        self.generators: dict[str, torch.Generator] = {}

    @torch.inference_mode()
    def execute_model(self, plan: SchedulerOutput) -> dict[str, int]:
        """Run every scheduled request's tokens; return ``{request_id: next token}`` for each
        request whose known tokens are now all computed (a partial prompt chunk samples nothing)."""
        sampled_ids, logits = [], []
        for request in plan.scheduled:
            n = plan.num_scheduled_tokens[request.request_id]
            hidden = self._forward_one(request, n)
            if request.num_computed_tokens + n == request.num_tokens:
                sampled_ids.append(request)
                logits.append(self.model.compute_logits(hidden[-1:]))
        if not sampled_ids:
            return {}
        tokens = sample(
            torch.cat(logits),
            [r.sampling_params for r in sampled_ids],
            [self._generator(r) for r in sampled_ids],
        )
        return dict(zip((r.request_id for r in sampled_ids), tokens.tolist()))  # the step's one sync

    def _forward_one(self, request: Request, n: int) -> torch.Tensor:
        cache = self.kv_caches.get(request.request_id)
        if cache is None:
            cache = ContiguousKVCache(self.model.config, request.max_num_tokens, self.dtype, self.device)
            self.kv_caches[request.request_id] = cache
        start = request.num_computed_tokens
        ids = torch.tensor(request.token_ids_slice(start, start + n), device=self.device)
        positions = torch.arange(start, start + n, device=self.device)
        hidden = self.model(ids, positions, cache)
        cache.advance(n)
        return hidden

    def _generator(self, request: Request) -> torch.Generator:
        g = self.generators.get(request.request_id)
        if g is None:
            g = torch.Generator(device=self.device).manual_seed(request.seed)
            self.generators[request.request_id] = g
        return g

    def free(self, request_id: str) -> None:
        """Release a finished request's KV cache and sampling state."""
        self.kv_caches.pop(request_id, None)
        self.generators.pop(request_id, None)

    def kv_tokens(self) -> int:
        return sum(c.num_tokens for c in self.kv_caches.values())
