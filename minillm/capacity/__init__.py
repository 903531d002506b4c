"""Chapter 8, the capstone: the largest arrival rate one engine can take while its requests still
meet their latency targets.

The four steps, as a capacity planner sizes a shared endpoint:

1. **Define the experience** as service-level objectives (SLOs): ``ttft_p95=0.5`` says "95% of
   requests see their first token within 0.5 s". ``parse_slo`` reads them.
2. **Replay a representative workload**: a named request mix (short chat turns, long prompts, long
   generations) arriving as a Poisson process, or in bursts, from a seed (``capacity_workload``).
3. **Record what users and the operator see** at one arrival rate (``measure``): output tokens/s,
   requests finished/s, the queue over time, TTFT / ITL / e2e percentiles, and goodput (requests/s
   that met every SLO of their own).
4. **Raise the rate until an SLO breaks** (``find_capacity``): a search, not a grid, that also stops
   where the engine is overloaded (its waiting queue keeps growing, so latency would grow without
   bound with a longer run; ``is_overloaded``).

What is measured is a *target*: any callable that takes a ``Workload`` (prompts, sampling
parameters, arrival times) and returns a ``TargetRun`` (per-request timings, and the queue over time
where it can see it). ``simulator_target`` runs the simulator, ``llm_target`` a real engine, and
``endpoint_target`` any OpenAI-compatible server over HTTP (``minillm.capacity.endpoint``), so the
method carries over to any server unchanged.

    slo.py        1. SLOs: ``parse_slo``, ``parse_slos``
    mixes.py      2. the request mixes and their arrivals: ``capacity_workload``, ``at_rate``
    targets.py    what is measured: ``simulator_target``, ``llm_target`` (``TargetRun``)
    endpoint.py   ... or any OpenAI-compatible server: ``endpoint_target``
    measure.py    3. one rate: ``measure``, ``is_overloaded``, goodput's ``request_is_good``
    search.py     4. the search: ``search_max_rate``, ``find_capacity`` (``CapacityResult``)
    budget.py     chapter 6's sizing question: the token budget an ITL target allows

    from minillm.capacity import find_capacity
    result = find_capacity("chunked", ["ttft_p95=0.5", "itl_p95=0.05"], profile="h200-qwen3-0.6b")
    result.max_rate, print(result.table())
"""

from minillm.capacity.budget import choose_token_budget, worst_itl_gap
from minillm.capacity.endpoint import EndpointError, endpoint_target
from minillm.capacity.measure import (
    RateResult,
    in_system,
    is_overloaded,
    mean_waiting,
    measure,
    measured_slice,
    middle_mean,
    request_is_good,
)
from minillm.capacity.mixes import (
    DEFAULT_MIX,
    MIXES,
    NUM_TURNS,
    SYSTEM_PROMPT_LENS,
    at_rate,
    base_workload,
    capacity_workload,
    mix_kinds,
    unit_arrivals,
)
from minillm.capacity.search import (
    DEFAULT_RATE_RANGE,
    REL_TOL,
    CapacityResult,
    check_rate_range,
    find_capacity,
    search_max_rate,
)
from minillm.capacity.slo import SLO, make_slo, parse_slo, parse_slos
from minillm.capacity.targets import RequestResult, Target, TargetRun, llm_target, run_from_outputs, simulator_target

__all__ = [
    "SLO",
    "CapacityResult",
    "DEFAULT_MIX",
    "DEFAULT_RATE_RANGE",
    "EndpointError",
    "MIXES",
    "NUM_TURNS",
    "REL_TOL",
    "RateResult",
    "RequestResult",
    "SYSTEM_PROMPT_LENS",
    "Target",
    "TargetRun",
    "at_rate",
    "base_workload",
    "capacity_workload",
    "check_rate_range",
    "choose_token_budget",
    "endpoint_target",
    "find_capacity",
    "in_system",
    "is_overloaded",
    "llm_target",
    "make_slo",
    "mean_waiting",
    "measure",
    "measured_slice",
    "middle_mean",
    "mix_kinds",
    "parse_slo",
    "parse_slos",
    "request_is_good",
    "run_from_outputs",
    "search_max_rate",
    "simulator_target",
    "unit_arrivals",
    "worst_itl_gap",
]
