"""Chapter 3: iteration-level scheduling (Orca), also called continuous batching.

A static batch is formed once per batch; Orca schedules once per *step*. Between any two steps,
requests that finished leave the batch and waiting requests take their slots, so a short request
never holds a slot it no longer needs and a new arrival waits for one step, not for a whole batch.

Each running request keeps a contiguous KV cache reserved for its longest possible sequence
(prompt + ``max_tokens``), so admission is limited twice: by ``max_num_seqs`` slots and by the KV
capacity, ``num_kv_tokens`` (``None``: no limit). Reserving for tokens that may never be generated is the waste that
chapter 5's paged cache removes.
"""

from __future__ import annotations

from minillm.request import Request
from minillm.scheduler import DEFAULT_MAX_NUM_SEQS, Scheduler, SchedulerOutput, check_max_num_seqs


class ContinuousBatchScheduler(Scheduler):
    def __init__(self, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, num_kv_tokens: int | None = None):
        super().__init__()
        check_max_num_seqs(max_num_seqs)
        if num_kv_tokens is not None and (isinstance(num_kv_tokens, bool) or not isinstance(num_kv_tokens, int)
                                          or num_kv_tokens < 1):
            raise ValueError(f"num_kv_tokens must be None (no limit) or an integer >= 1, got {num_kv_tokens!r}")
        self.max_num_seqs = max_num_seqs
        self.num_kv_tokens = num_kv_tokens
        self.num_reserved_kv_tokens = 0  # reserved by the running requests

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_tokens or 0

    def check_request(self, request: Request) -> None:
        if self.num_kv_tokens is not None and request.max_num_tokens > self.num_kv_tokens:
            raise ValueError(
                f"request {request.request_id}: {request.num_prompt_tokens} prompt tokens + max_tokens="
                f"{request.sampling_params.max_tokens} needs {request.max_num_tokens} KV cache tokens, more than "
                f"num_kv_tokens={self.num_kv_tokens}"
            )

    def schedule(self, now: float) -> SchedulerOutput:
        """Admit waiting requests in arrival order while a slot and their KV reservation are free,
        then run every running request: a new one's whole prompt, the others one decode token."""
        admitted = []
        while self.waiting and len(self.running) < self.max_num_seqs and self._kv_fits(self.waiting[0]):
            request = self.waiting.popleft()
            self.num_reserved_kv_tokens += request.max_num_tokens
            self._admit(request)
            admitted.append(request.request_id)
        return self._plan(admitted)

    def _kv_fits(self, request: Request) -> bool:
        return self.num_kv_tokens is None or self.num_reserved_kv_tokens + request.max_num_tokens <= self.num_kv_tokens

    def finish_request(self, request: Request) -> None:
        super().finish_request(request)
        self.num_reserved_kv_tokens -= request.max_num_tokens
