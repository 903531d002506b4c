"""A request's life inside the engine, and what the user gets back at the end."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from minillm.metrics import RequestMetrics
from minillm.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # arrived, not running (never started, or preempted)
    RUNNING = "running"  # holds a slot and KV cache
    FINISHED = "finished"


class Request:
    """Prompt, generated tokens and progress. ``num_computed_tokens`` counts the tokens whose keys
    and values are already in the KV cache; the scheduler decides how many more to compute next.

    ``num_prompt_tokens`` and ``num_tokens`` (prompt + output so far) are stored counts, not ``len``
    sums: the scheduler, the runner and the engine read them for every request at every step.
    Generated tokens therefore go through ``append_output_token_ids``, which keeps the count right."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        arrival_time: float,
        seed: int = 0,
    ):
        self.request_id = request_id
        self.seed = seed  # seeds this request's sampling generator
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)  # the prompt never changes
        self.sampling_params = sampling_params
        self.output_token_ids: list[int] = []
        self.num_tokens = self.num_prompt_tokens  # prompt + output so far
        self.num_computed_tokens = 0
        self.num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache at first admission
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        self.metrics = RequestMetrics(arrival_time=arrival_time)

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        """Tokens ``start:end`` of prompt + output, without copying the whole sequence."""
        p = self.num_prompt_tokens
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return self.prompt_token_ids[start:end] + self.output_token_ids[: max(0, end - p)]

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        """Add one generated token, or a list of them (vLLM's name and signature), keeping
        ``num_tokens`` in step."""
        if isinstance(token_ids, int):
            self.output_token_ids.append(token_ids)
            self.num_tokens += 1
        else:
            self.output_token_ids.extend(token_ids)
            self.num_tokens += len(token_ids)

    @property
    def max_num_tokens(self) -> int:
        """The most tokens this request can ever hold in the KV cache."""
        return self.num_prompt_tokens + self.sampling_params.max_tokens

    @property
    def is_decode(self) -> bool:
        """True when the request's next step is a decode: its prompt and all its generated tokens but
        the newest are in the KV cache, so it computes exactly one token, the newest. The one place
        that says what a decode is: the loop's trace, the runners and the schedulers all ask here.
        Anything else a running request computes is a prefill, of its prompt (or a chunk of it), or,
        after a preemption by recompute, of its prompt and the tokens it had generated."""
        return self.num_computed_tokens == self.num_tokens - 1 >= self.num_prompt_tokens

    def __repr__(self):
        return f"Request({self.request_id}, {self.status.value}, computed={self.num_computed_tokens}/{self.num_tokens})"


@dataclass
class RequestOutput:
    """What ``LLM.generate`` returns for each prompt, in prompt order."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "length" (hit max_tokens) or "stop" (EOS or a stop token)
    metrics: RequestMetrics
    num_cached_tokens: int = 0  # tokens found in the prefix cache (vLLM's name; 0 with caching off)
