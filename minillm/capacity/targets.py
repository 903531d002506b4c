"""What the capacity tool measures: a *target*, any callable that takes a ``Workload`` and returns a
``TargetRun`` (per-request timings as a client sees them, and the queue over time where the target
can see it).

``simulator_target`` runs the simulator, ``llm_target`` a real engine; ``endpoint_target``
(``minillm.capacity.endpoint``) any OpenAI-compatible server over HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from minillm.sim import simulate
from minillm.sim.cost_model import Profile
from minillm.sim.simulate import build_sim_engine
from minillm.workloads import Workload


@dataclass
class RequestResult:
    """One request as a client sees it: seconds since the run started."""

    arrival_time: float
    ttft: float
    itl: list[float]  # the gaps between consecutive tokens
    e2e: float

    @property
    def num_output_tokens(self) -> int:
        return len(self.itl) + 1

    @property
    def finish_time(self) -> float:
        return self.arrival_time + self.e2e

    @property
    def tpot(self) -> float:
        """Time per output token after the first: the request's mean ITL (NaN for one token)."""
        return float(np.mean(self.itl)) if self.itl else float("nan")

    def token_times(self) -> np.ndarray:
        first = self.arrival_time + self.ttft
        return first + np.concatenate([[0.0], np.cumsum(self.itl)])


@dataclass
class TargetRun:
    """What a target reports for one workload: its requests (in workload order) and, where the
    target can see inside, requests waiting after each step as ``(time, count)`` pairs."""

    requests: list[RequestResult]
    waiting: list[tuple[float, int]] | None = None


Target = Callable[[Workload], TargetRun]


def run_from_outputs(outputs, trace=None) -> TargetRun:
    """A ``TargetRun`` from ``RequestOutput``s (a real or simulated run) and its ``Trace``."""
    requests = [RequestResult(o.metrics.arrival_time, o.metrics.ttft, o.metrics.itl, o.metrics.e2e) for o in outputs]
    waiting = [(r.end_time, r.num_waiting) for r in trace] if trace is not None else None
    return TargetRun(requests, waiting)


def simulator_target(engine: str = "chunked", profile="h200-qwen3-0.6b", **engine_options) -> Target:
    """Run each workload on the simulator: the engine's real scheduler, timed by ``profile``.
    Deterministic: the same workload gives the same numbers, to the last bit."""
    profile = profile if isinstance(profile, Profile) else Profile.load(profile)
    build_sim_engine(engine, profile, **engine_options)  # a bad engine name or option fails now, not mid-search

    def run(workload: Workload) -> TargetRun:
        result = simulate(engine, workload, profile, block_maps=False, **engine_options)  # the search reads no map
        return run_from_outputs(result.outputs, result.trace)

    run.description = f"simulator, profile {profile.name}"
    return run


def llm_target(llm) -> Target:
    """Run each workload on a real engine (``LLM``), in real time: requests join at their arrival
    times. Wall-clock timings vary a little between runs, so the search is repeatable only roughly."""

    def run(workload: Workload) -> TargetRun:
        # One LLM serves every rate, and its prefix cache outlives a call: without a reset, a rate would
        # find the blocks of the rates tried before it, so its result would depend on the search order
        # (the first rate cold, the rest warm). Each rate starts cold, as in the simulator, which builds
        # a new engine per run. (A no-op with caching off.)
        llm.reset_prefix_cache()
        outputs = llm.generate(workload.prompts, workload.sampling_params, workload.arrival_times)
        return run_from_outputs(outputs, llm.trace)

    run.description = f"real engine on {llm.device}"
    return run
