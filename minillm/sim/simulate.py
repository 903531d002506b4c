"""``simulate``: run an engine's real scheduler through the real engine loop, with a cost model in
place of the model and a simulated clock in place of the wall clock.

    from minillm.sim import simulate
    from minillm import workloads
    result = simulate("continuous", workloads.two_slot_example(), max_num_seqs=2)
    result.trace            # the same Trace a real run records, in simulated seconds
    result.outputs[0].metrics.ttft
    result.summary["time_to_first_token_seconds"]["p95"]

Nothing about scheduling is simulated: the engine, its scheduler and their options are built by the
same ``build_engine`` as ``LLM``'s, around a weightless model; only the runner and the clock are
swapped. So a simulated run makes exactly the real run's step-by-step decisions; its times are the
cost model's. It computes no tokens: every request runs to ``max_tokens`` (EOS never fires). That
lets it run stretches of identical decode steps at once (``minillm.sim.fast_forward``), with the
same results as step by step.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from minillm.engines import build_engine
from minillm.metrics import summarize
from minillm.request import Request, RequestOutput
from minillm.sim.clock import SimClock
from minillm.sim.cost_model import Profile
from minillm.sim.fast_forward import SimEngine
from minillm.sim.model_shape import weightless_model
from minillm.sim.twins import SIM_RUNNERS
from minillm.trace import Trace
from minillm.workloads import Workload

DEFAULT_PROFILE = "h200-qwen3-0.6b"


@dataclass
class SimResult:
    """What ``LLM.generate`` and ``llm.trace`` give for a real run, plus the summary and the profile."""

    outputs: list[RequestOutput]  # in workload order, with the same metrics as a real run
    trace: Trace
    summary: dict  # ``minillm.metrics.summarize(outputs, trace)``
    profile: Profile


def simulate(
    engine: str,
    workload: Workload,
    profile: str | Profile = DEFAULT_PROFILE,
    fast_forward: bool = True,
    block_maps: bool = True,
    **engine_options,
) -> SimResult:
    """Replay ``workload`` on engine ``engine`` (``"naive"``, ``"static"``, ...) with its engine
    options (``max_num_seqs=...``, or ``scheduler_cls=`` to run your own scheduler), timed by
    ``profile``: a shipped profile's name, a JSON path, or a ``Profile``. ``fast_forward=False``
    runs every step through the engine loop (same results, slower); ``block_maps=False`` leaves the
    trace's block tables and cached blocks out (what only the block-map widgets read)."""
    profile = profile if isinstance(profile, Profile) else Profile.load(profile)
    sim_engine = build_sim_engine(engine, profile, fast_forward, block_maps, **engine_options)
    gc_was_enabled = gc.isenabled()
    # Millions of small objects and no reference cycles: the collector would only rescan them, and
    # it would do so also while the outputs and the summary are built after the run.
    gc.disable()
    try:
        requests = _requests(workload, profile)
        for r in requests:
            sim_engine.add_request(r)
        sim_engine.run_to_completion()
        outputs = [
            RequestOutput(
                r.request_id,
                r.prompt_token_ids,
                r.output_token_ids,
                "",
                r.finish_reason,
                r.metrics,
                r.num_cached_tokens or 0,
            )
            for r in requests
        ]
        summary = summarize(outputs, sim_engine.trace)
    finally:
        if gc_was_enabled:
            gc.enable()
    return SimResult(outputs, sim_engine.trace, summary, profile)


def build_sim_engine(
    engine: str, profile: Profile, fast_forward: bool = True, block_maps: bool = True, **engine_options
) -> SimEngine:
    """The real engine ``engine`` (scheduler and options checked as ``LLM`` checks them, including
    ``scheduler_cls=``), with the real runner's simulated twin and a ``SimClock``."""
    model = weightless_model(profile.model, profile_dtype(profile))
    real = build_engine(engine, model, torch.device("meta"), None, **engine_options)
    # A runner_cls (a course exercise) lays out its passes as the runner it extends.
    twin = next((SIM_RUNNERS[cls] for cls in type(real.runner).__mro__ if cls in SIM_RUNNERS), None)
    if twin is None and engine_options.get("runner_cls") is not None:
        raise ValueError(
            f"runner_cls={type(real.runner).__name__} extends none of the runners the simulator can time "
            f"({', '.join(cls.__name__ for cls in SIM_RUNNERS)}): extend one of them to simulate it"
        )
    if twin is None:
        raise NotImplementedError(f"the simulator has no twin of {type(real.runner).__name__} (engine {engine!r}) yet")
    clock = SimClock()
    return SimEngine(real.scheduler, twin(profile, clock), clock, fast_forward, block_maps)


def profile_dtype(profile: Profile) -> torch.dtype:
    """The dtype the profile's KV bytes per token imply (bfloat16 for a 2-byte profile)."""
    cfg = weightless_model(profile.model).config
    kv_values_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    per_value = profile.kv_bytes_per_token * profile.tensor_parallel_size / kv_values_per_token  # one rank's share
    dtypes = {2: torch.bfloat16, 4: torch.float32}
    if per_value not in dtypes:
        raise ValueError(
            f"profile {profile.name!r}: kv_bytes_per_token={profile.kv_bytes_per_token:g} is "
            f"{per_value:g} bytes per value; the simulator prices 2 (bfloat16) or 4 (float32)"
        )
    return dtypes[per_value]


def _requests(workload: Workload, profile: Profile) -> list[Request]:
    max_len = profile.model["max_position_embeddings"]
    requests = []
    for i, (prompt, params, t) in enumerate(zip(workload.prompts, workload.sampling_params, workload.arrival_times)):
        if not prompt:
            raise ValueError(f"request {i} has an empty prompt")
        if len(prompt) + params.max_tokens > max_len:
            raise ValueError(
                f"request {i}: {len(prompt)} prompt tokens + max_tokens={params.max_tokens} exceeds the model's "
                f"max_position_embeddings ({max_len})"
            )
        requests.append(Request(str(i), prompt, params, arrival_time=t))
    return requests
