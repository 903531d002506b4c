"""How each request wants its tokens chosen and when it wants to stop (vLLM's ``SamplingParams``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Temperatures below this sample greedily (vLLM's ``_SAMPLING_EPS``): dividing the logits by a
# temperature near 0 overflows them to infinity, and a softmax over infinities is NaN.
SAMPLING_EPS = 1e-5


@dataclass
class SamplingParams:
    """``temperature=0`` (or below ``SAMPLING_EPS``) is greedy. ``top_k=0`` and ``top_p=1`` switch those filters off.
    ``seed`` gives this request its own random stream, so its samples do not depend on which other
    requests share its batch."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not (
            isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0
        ):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS
