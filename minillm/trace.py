"""One row per engine step: the single interface between engines and everything that looks at
them (metrics, widgets, tests)."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter


@dataclass(slots=True)  # no per-row __dict__: a long run records hundreds of thousands of rows
class StepRecord:
    step: int
    start_time: float
    end_time: float
    num_scheduled_tokens: dict[str, int]  # request id -> tokens computed this step
    prefill_ids: list[str]  # requests whose prompt (or part of it) ran this step
    decode_ids: list[str]  # requests that ran one decode token
    admitted_ids: list[str] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)
    num_running: int = 0  # after the step
    num_waiting: int = 0  # after the step
    kv_tokens: int = 0  # tokens held in the KV cache after the step
    kv_allocated_tokens: int = 0  # KV memory allocated after the step, in tokens: held + reserved + padding
    kv_capacity_tokens: int = 0  # the KV cache size in tokens the scheduler admits against (0: no limit)
    slots: dict[str, int] = field(default_factory=dict)  # request id -> batch slot, for every request holding one
    # (a request in ``slots`` but not in ``num_scheduled_tokens`` holds its slot idle: a static batch's finished row)
    num_input_tokens: int = 0  # token rows the forward passes computed, padding included
    num_forward_passes: int = 0
    # The paged engine (chapter 5) only: request id -> the physical KV blocks it holds after the step,
    # in logical order; None when no table changed since the previous step (rows stay small).
    block_tables: dict[str, list[int]] | None = None
    swapped_out_ids: list[str] = field(default_factory=list)  # preempted to host memory (also in preempted_ids)
    # Prefix caching only: the free blocks whose hash is still cached (a later prompt with the same
    # first tokens reuses them until they are evicted), in id order; None when unchanged since the
    # previous step, and always None for engines without the cache.
    cached_free_blocks: list[int] | None = None

    @property
    def duration(self) -> float:
        return self.end_time - self.start_time

    @property
    def num_batched_tokens(self) -> int:
        """Useful tokens: the ones the plan asked for."""
        return sum(self.num_scheduled_tokens.values())

    @property
    def num_padding_tokens(self) -> int:
        """Computed for nothing: ``num_input_tokens - num_batched_tokens``."""
        return self.num_input_tokens - self.num_batched_tokens


class Trace:
    def __init__(self):
        self.steps: list[StepRecord] = []
        self.num_gpu_blocks: int | None = None  # the paged engine's KV pool: its blocks and their size
        self.block_size: int | None = None

    def record(self, record: StepRecord) -> None:
        self.steps.append(record)

    def column(self, name: str) -> list:
        """One field of every row, in step order."""
        return list(map(attrgetter(name), self.steps))

    def __len__(self):
        return len(self.steps)

    def __iter__(self):
        return iter(self.steps)

    def __getitem__(self, i):
        return self.steps[i]
