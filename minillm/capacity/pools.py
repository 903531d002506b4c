"""Beyond one GPU (chapter 10), simulated: several GPUs serving one stream of requests,
each running the engine's real scheduler and timed by the cost model.

``colocated_target(n)``: ``n`` GPUs, each a whole engine (prefills and decodes in the same steps,
chunked prefill's way), requests dealt to them in turn, as a round-robin router would.

``routed_target(n, policy)``: the same replicas behind a router that sees them as it routes
(``minillm.capacity.routing``: round robin, or SGLang's cache-aware rule).

``disaggregated_target(num_prefill, num_decode)``: prefill and decode on different GPUs, as DistServe
proposes [distserve-paper]: a prefill pool computes each prompt and its first token; the request's
KV cache then crosses a link (``link_bytes_per_s``; by default an H200 server's NVLink
[mlcommons-h200-system], 450 GB/s one way [h200-nvlink]) to a decode pool, which generates the rest. A
decode GPU's steps then never carry a prompt, so its gaps between tokens stay short; the price is the
transfer, and GPUs split by role instead of shared.

Both are capacity targets (``minillm.capacity.find_capacity(target=...)``), so the same SLOs and the
same search compare them at the same number of GPUs. Requests are dealt in arrival order: pool ``k``
of ``n`` takes every ``n``-th one.
"""

from __future__ import annotations

from minillm.capacity.routing import routing_policy
from minillm.capacity.targets import RequestResult, Target, TargetRun
from minillm.request import Request
from minillm.sampling_params import SamplingParams
from minillm.scheduler import check_count
from minillm.sim.cost_model import NVLINK_BYTES_PER_S, Profile
from minillm.sim.simulate import build_sim_engine
from minillm.sim.twins import SIM_TOKEN_ID
from minillm.workloads import Workload


def _deal(times: list[float], n: int) -> list[list[int]]:
    """The request indices each of ``n`` pools takes: every ``n``-th in the order of ``times``."""
    order = sorted(range(len(times)), key=lambda i: times[i])
    return [order[k::n] for k in range(n)]


def _run(engine, requests: list[Request]) -> None:
    for r in requests:
        engine.add_request(r)
    engine.run_to_completion()


def colocated_target(num_gpus: int, engine: str = "chunked", profile="h200-qwen3-0.6b", **engine_options) -> Target:
    """``num_gpus`` GPUs, each running ``engine`` with ``engine_options``, the requests dealt in turn."""
    check_count("num_gpus", num_gpus)
    profile = profile if isinstance(profile, Profile) else Profile.load(profile)
    build_sim_engine(engine, profile, **engine_options)  # bad options fail now, not mid-search

    def run(workload: Workload) -> TargetRun:
        results: list[RequestResult | None] = [None] * len(workload)
        run.traces = {}
        for k, share in enumerate(_deal(workload.arrival_times, num_gpus)):
            gpu = build_sim_engine(engine, profile, block_maps=False, **engine_options)
            requests = [_request(workload, i) for i in share]
            _run(gpu, requests)
            run.traces[f"GPU {k}"] = gpu.trace
            for i, r in zip(share, requests):
                m = r.metrics
                results[i] = RequestResult(m.arrival_time, m.ttft, m.itl, m.e2e)
        return TargetRun(results)

    run.traces = {}  # the last run's steps, GPU by GPU (for ``minillm.widgets.draw_step_mix``)
    run.description = f"simulator, profile {profile.name}, {num_gpus} GPU(s), each prefill and decode"
    return run


def routed_target(
    num_replicas: int, policy: str = "cache_aware", engine: str = "chunked", profile="h200-qwen3-0.6b", **engine_options
) -> Target:
    """``num_replicas`` GPUs, each running ``engine``, behind a router (``minillm.capacity.routing``):
    the replicas run side by side in simulated time, so the router sees each one's unfinished
    requests when a request arrives, as a real router counts what it sent and has not heard back.
    ``run.hit_rates`` keeps each run's share of prompt tokens found in the replicas' prefix caches
    (with ``enable_prefix_caching=True``)."""
    check_count("num_replicas", num_replicas)
    routing_policy(policy, num_replicas)
    profile = profile if isinstance(profile, Profile) else Profile.load(profile)
    build_sim_engine(engine, profile, **engine_options)

    def run(workload: Workload) -> TargetRun:
        options = dict(fast_forward=False, block_maps=False, **engine_options)
        replicas = [build_sim_engine(engine, profile, **options) for _ in range(num_replicas)]
        router = routing_policy(policy, num_replicas)
        requests: dict[int, Request] = {}
        for i in sorted(range(len(workload)), key=lambda i: workload.arrival_times[i]):
            now = workload.arrival_times[i]
            for replica in replicas:  # each replica runs the steps it starts before this arrival
                while replica.has_unfinished_requests() and replica.clock.now() < now:
                    replica.step(stream=False)
            loads = [len(r.pending) + len(r.scheduler.requests) for r in replicas]
            requests[i] = _request(workload, i)
            replicas[router.select(workload.prompts[i], loads)].add_request(requests[i])
        for replica in replicas:
            replica.run_to_completion()
        run.traces = {f"GPU {k}": replica.trace for k, replica in enumerate(replicas)}
        queries = sum(getattr(r.scheduler, "prefix_cache_queries", 0) for r in replicas)
        hits = sum(getattr(r.scheduler, "prefix_cache_hits", 0) for r in replicas)
        run.hit_rates.append(hits / queries if queries else 0.0)
        metrics = [requests[i].metrics for i in range(len(workload))]
        return TargetRun([RequestResult(m.arrival_time, m.ttft, m.itl, m.e2e) for m in metrics])

    run.hit_rates, run.traces = [], {}
    run.description = f"simulator, profile {profile.name}, {num_replicas} replica(s) behind a {policy} router"
    return run


def disaggregated_target(
    num_prefill: int,
    num_decode: int,
    engine: str = "chunked",
    profile="h200-qwen3-0.6b",
    link_bytes_per_s: float = NVLINK_BYTES_PER_S,
    **engine_options,
) -> Target:
    """A prefill pool of ``num_prefill`` GPUs and a decode pool of ``num_decode``, each GPU running
    ``engine`` with ``engine_options``; a request's KV cache (``profile.kv_bytes_per_token`` per prompt
    token) crosses ``link_bytes_per_s`` between them."""
    check_count("num_prefill", num_prefill)
    check_count("num_decode", num_decode)
    if not link_bytes_per_s > 0:
        raise ValueError(f"link_bytes_per_s must be > 0, got {link_bytes_per_s!r}")
    profile = profile if isinstance(profile, Profile) else Profile.load(profile)
    build_sim_engine(engine, profile, **engine_options)

    def run(workload: Workload) -> TargetRun:
        # 1. The prefill pool: each request's prompt and its first token.
        first: dict[int, Request] = {}
        run.traces = {}
        for k, share in enumerate(_deal(workload.arrival_times, num_prefill)):
            gpu = build_sim_engine(engine, profile, block_maps=False, **engine_options)
            requests = [_request(workload, i, max_tokens=1) for i in share]
            _run(gpu, requests)
            first.update(zip(share, requests))
            run.traces[f"prefill GPU {k}"] = gpu.trace
        # 2. The KV cache crosses the link; the decode pool takes each request when its cache is there.
        kv_seconds = [len(p) * profile.kv_bytes_per_token / link_bytes_per_s for p in workload.prompts]
        ready = [first[i].metrics.first_token_time + kv_seconds[i] for i in range(len(workload))]
        later: dict[int, Request] = {}
        for k, share in enumerate(_deal(ready, num_decode)):
            share = [i for i in share if workload.sampling_params[i].max_tokens > 1]  # done with one token
            gpu = build_sim_engine(engine, profile, block_maps=False, **engine_options)
            requests = [_arrived_with_cache(workload, i, ready[i]) for i in share]
            _run(gpu, requests)
            later.update(zip(share, requests))
            run.traces[f"decode GPU {k}"] = gpu.trace
        # 3. What the client saw: the first token from the prefill pool, the rest from the decode pool.
        results = []
        for i in range(len(workload)):
            m = first[i].metrics
            times = [m.first_token_time] + (later[i].metrics.token_times if i in later else [])
            gaps = [b - a for a, b in zip(times, times[1:])]
            results.append(RequestResult(m.arrival_time, m.ttft, gaps, times[-1] - m.arrival_time))
        return TargetRun(results)

    run.traces = {}  # the last run's steps, GPU by GPU, prefill pool first
    run.description = (
        f"simulator, profile {profile.name}, {num_prefill} prefill + {num_decode} decode GPU(s), "
        f"KV over {link_bytes_per_s / 1e9:g} GB/s"
    )
    return run


def _request(workload: Workload, i: int, max_tokens: int | None = None) -> Request:
    params = workload.sampling_params[i]
    if max_tokens is not None:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(str(i), workload.prompts[i], params, arrival_time=workload.arrival_times[i])


def _arrived_with_cache(workload: Workload, i: int, ready: float) -> Request:
    """Request ``i`` as the decode pool receives it: its prompt's keys and values already in its
    cache, its first token generated; it computes that token's keys and values next."""
    request = Request(str(i), workload.prompts[i], workload.sampling_params[i], arrival_time=ready)
    request.append_output_token_ids(SIM_TOKEN_ID)
    request.num_computed_tokens = request.num_prompt_tokens
    return request
