"""The runner's side of the loop: a runner executes a step plan on the model and returns the
sampled tokens.

Every engine's runner (``minillm.engines``) extends ``ModelRunnerBase``: what differs between them
is how a step's tokens are laid out for the model and where keys and values live (one cache per
request, a padded batch, one flat token batch, paged blocks); sampling and its per-request seeded
generators are shared and live here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.models.llama import CausalLM
from minillm.models.sampler import sample
from minillm.request import Request
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
        self.device = torch.device(device)  # "cuda" or a torch.device alike
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
