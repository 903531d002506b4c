"""Chapter 7, the capstone: the largest arrival rate one engine can take while its requests still
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
``endpoint_target`` any OpenAI-compatible server over HTTP (``minillm.capacity_endpoint``), so the
method carries over to any server unchanged.

    from minillm.capacity import find_capacity
    result = find_capacity("chunked", ["ttft_p95=0.5", "itl_p95=0.05"], profile="h200-qwen3-0.6b")
    result.max_rate, print(result.table())
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable

import numpy as np

from minillm.workloads import LENGTH_MIXES, Workload, draw_lengths, fixed, uniform

# --------------------------------------------------------------------------------------------------
# 1. SLOs
# --------------------------------------------------------------------------------------------------

SLO_METRICS = {  # metric -> what it measures, per request
    "ttft": "time to first token (queueing + prefill)",
    "itl": "inter-token latency (every gap between two tokens, pooled over requests)",
    "e2e": "end-to-end latency (arrival to last token)",
}
SLO_PATTERN = re.compile(r"^(ttft|itl|e2e)_p(\d+(?:\.\d+)?)$")  # the percentile: 0 < p < 100


@dataclass(frozen=True)
class SLO:
    """``metric``'s ``percentile``-th percentile must be at most ``target`` seconds."""

    metric: str  # "ttft", "itl" or "e2e"
    percentile: float  # 95 for p95
    target: float  # seconds

    @property
    def name(self) -> str:
        """``ttft_p95``: the key of this percentile in a ``RateResult``'s latencies and in JSON."""
        return f"{self.metric}_p{self.percentile:g}"

    def __str__(self) -> str:
        return f"{self.name}={self.target:g}"


def parse_slo(text: str) -> SLO:
    """``"ttft_p95=0.5"`` -> ``SLO("ttft", 95, 0.5)``. The metric is ``ttft``, ``itl`` or ``e2e`` with
    a percentile ``pNN`` (0 < NN < 100), the target seconds > 0; anything else is a ``ValueError``
    that names the part at fault."""
    if not isinstance(text, str) or text.count("=") != 1:
        raise ValueError(f"SLO {text!r}: write it as METRIC=SECONDS, e.g. ttft_p95=0.5")
    name, value = (part.strip() for part in text.split("="))
    return make_slo(name, value, where=f"SLO {text!r}")


def make_slo(name: str, target, where: str | None = None) -> SLO:
    """An ``SLO`` from its name (``"itl_p95"``) and target (seconds, a number or a numeric string)."""
    where = where or f"SLO {name!r}"
    match = SLO_PATTERN.match(str(name))
    percentile = float(match.group(2)) if match else None
    if match is None:
        raise ValueError(f"{where}: unknown metric {name!r}; use ttft, itl or e2e with a percentile pNN "
                         "(0 < NN < 100), e.g. ttft_p95, itl_p50, e2e_p99.9")
    if not 0 < percentile < 100:
        raise ValueError(f"{where}: the percentile of {name} must be above 0 and below 100 (p0.5, p50, p99.9, ...), "
                         f"got {percentile:g}")
    try:
        seconds = float(target)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: the target of {name} must be a number of seconds, got {target!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{where}: the target of {name} must be a number of seconds > 0, got {target!r}")
    return SLO(match.group(1), percentile, seconds)


def parse_slos(slos) -> tuple[SLO, ...]:
    """Every form the tool takes: ``{"ttft_p95": 0.5}``, ``["ttft_p95=0.5", "itl_p95=0.05"]``, one
    string, or ``SLO`` objects. At least one; each metric percentile at most once."""
    if isinstance(slos, (str, SLO)):
        slos = [slos]
    if isinstance(slos, dict):
        parsed = [make_slo(name, target) for name, target in slos.items()]
    else:
        parsed = [s if isinstance(s, SLO) else parse_slo(s) for s in (slos or [])]
    if not parsed:
        raise ValueError("slo: give at least one SLO, e.g. ttft_p95=0.5")
    names = [s.name for s in parsed]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"slo: {name} is given {names.count(name)} times; give each metric percentile once")
    return tuple(parsed)


# --------------------------------------------------------------------------------------------------
# 2. The workload: a named request mix, arrivals at a rate
# --------------------------------------------------------------------------------------------------

# A kind of request: (weight, prompt length distribution, output length distribution), as in
# ``minillm.workloads.LENGTH_MIXES``. Lengths suit Qwen3-0.6B on the H200 profile.
CHAT = (1.0, uniform(32, 256), uniform(16, 128))  # a question, a short answer
LONG_PROMPT = (1.0, uniform(1024, 2048), uniform(32, 128))  # a document to summarise (RAG)
LONG_GENERATION = (1.0, uniform(32, 256), uniform(512, 1024))  # code, an essay

MIXES: dict[str, list[tuple[float, Callable, Callable]]] = {
    "chat": [CHAT],
    "long prompts": [LONG_PROMPT],
    "long generations": [LONG_GENERATION],
    # what a shared endpoint sees: mostly chat, a few of each heavy kind
    "mixed": [(0.8, *CHAT[1:]), (0.1, *LONG_PROMPT[1:]), (0.1, *LONG_GENERATION[1:])],
    # short enough for a real model on a laptop CPU (the tiny model's 2,048 positions included)
    "cpu chat": [(1.0, uniform(8, 32), uniform(4, 16))],
}
DEFAULT_MIX = "mixed"
BURSTY = 0.25  # ``bursty=True``: gamma gaps with shape 0.25, a coefficient of variation of 2


def mix_kinds(mix) -> list[tuple[float, Callable, Callable]]:
    """A mix's kinds: one of ``MIXES``, one of ``minillm.workloads.LENGTH_MIXES``, or a list of
    ``(weight, prompt lengths, output lengths)`` of your own."""
    if isinstance(mix, str):
        kinds = MIXES.get(mix, LENGTH_MIXES.get(mix))
        if kinds is None:
            raise ValueError(f"mix: unknown mix {mix!r}; choose one of {', '.join(map(repr, [*MIXES, *LENGTH_MIXES]))}")
        return kinds
    return list(mix)


def unit_arrivals(num_requests: int, seed: int = 0, burstiness: float = 1.0) -> np.ndarray:
    """Arrival times at one request per second. Gaps are gamma-distributed with mean 1 and shape
    ``burstiness``, as vLLM's serving benchmark draws them: 1 is a Poisson process (exponential
    gaps); below 1 requests come in bursts separated by lulls (the gaps' coefficient of variation is
    ``1 / sqrt(burstiness)``).

    Arrivals at rate r are these times divided by r: every rate replays the *same* requests in the
    same order, only compressed in time. So two rates differ in load and nothing else, which is what
    makes the capacity search deterministic and monotone in the SLOs."""
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0 (1 is Poisson, below 1 is bursty), got {burstiness}")
    rng = np.random.default_rng([seed, 1])  # a stream of its own: the lengths keep theirs
    return np.cumsum(rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=num_requests))


def capacity_workload(mix=DEFAULT_MIX, num_requests: int = 500, rate: float = 1.0, seed: int = 0,
                      burstiness: float = 1.0, vocab_size: int = 256) -> Workload:
    """``num_requests`` requests of ``mix`` arriving at ``rate`` per second (Poisson, or bursty when
    ``burstiness`` < 1). The lengths depend on ``seed`` only, never on the rate."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests per second, got {rate}")
    base = base_workload(mix, num_requests, seed, burstiness, vocab_size)
    return at_rate(base, rate)


def base_workload(mix, num_requests: int, seed: int = 0, burstiness: float = 1.0, vocab_size: int = 256) -> Workload:
    """The workload at one request per second (``at_rate`` rescales it)."""
    if not isinstance(num_requests, int) or num_requests < 2:
        raise ValueError(f"num_requests must be an integer >= 2, got {num_requests!r}")
    prompt_lens, output_lens = draw_lengths(mix_kinds(mix), num_requests, np.random.default_rng(seed))
    times = unit_arrivals(num_requests, seed, burstiness).tolist()
    return fixed(prompt_lens, output_lens, times, vocab_size, seed)


def at_rate(base: Workload, rate: float) -> Workload:
    """``base`` (arrivals at 1 request/s) with its arrival times divided by ``rate``."""
    return Workload(base.prompts, base.sampling_params, [t / rate for t in base.arrival_times])


# --------------------------------------------------------------------------------------------------
# Targets: what is measured
# --------------------------------------------------------------------------------------------------

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
    from minillm.sim import simulate
    from minillm.sim.cost_model import Profile
    from minillm.sim.simulate import build_sim_engine

    profile = profile if isinstance(profile, Profile) else Profile.load(profile)
    build_sim_engine(engine, profile, **engine_options)  # a bad engine name or option fails now, not mid-search

    def run(workload: Workload) -> TargetRun:
        result = simulate(engine, workload, profile, **engine_options)
        return run_from_outputs(result.outputs, result.trace)

    run.description = f"simulator, profile {profile.name}"
    return run


def llm_target(llm) -> Target:
    """Run each workload on a real engine (``LLM``), in real time: requests join at their arrival
    times. Wall-clock timings vary a little between runs, so the search is repeatable only roughly."""

    def run(workload: Workload) -> TargetRun:
        outputs = llm.generate(workload.prompts, workload.sampling_params, workload.arrival_times)
        return run_from_outputs(outputs, llm.trace)

    run.description = f"real engine on {llm.device}"
    return run


def endpoint_target(url: str, model: str, api_key: str | None = None, max_concurrency: int | None = None,
                    **options) -> Target:
    """Run each workload against any OpenAI-compatible streaming server (minillm's own, vLLM,
    SGLang), as its clients would: each request sent at its arrival time, TTFT / ITL / e2e timed
    on the client from the stream. ``url`` is the API's root (``http://127.0.0.1:8000/v1``),
    ``model`` the name the server serves. See ``minillm.capacity_endpoint``."""
    from minillm.capacity_endpoint import endpoint_target as build  # httpx loads only for this target

    return build(url, model, api_key=api_key, max_concurrency=max_concurrency, **options)


# --------------------------------------------------------------------------------------------------
# 3. One rate: throughput, queue, latency percentiles, goodput, overload
# --------------------------------------------------------------------------------------------------

REPORTED_PERCENTILES = (50, 90, 95, 99)
# the overload test (``is_overloaded``)
OVERLOAD_TOLERANCE = 0.05  # queue growth, as a fraction of the measured requests ...
MIN_QUEUE_GROWTH = 3  # ... and at least this many requests
MIN_TREND_REQUESTS = 32  # no queue to see: judge the TTFT trend only from this many measured requests
TTFT_GROWTH, TTFT_GROWTH_FLOOR = 2.0, 0.05  # ... overloaded: the typical TTFT more than doubled, and by > 50 ms


@dataclass
class RateResult:
    """What one arrival rate gave, over the measured requests (warm-up and cool-down left out)."""

    rate: float  # offered load, requests/s
    met: bool  # every SLO met and not overloaded
    violations: list[str]  # the SLOs it broke, and "overload"
    latencies: dict[str, float]  # "ttft_p95": seconds, ... for ttft, itl, e2e, tpot
    output_tokens_per_s: float  # tokens delivered during the measurement window, per second
    requests_per_s: float  # requests finished during the window, per second
    goodput: float  # requests/s that met every SLO of their own: slo_attainment x the window's arrival rate
    slo_attainment: float  # the fraction of measured requests that met every SLO
    overloaded: bool  # the queue kept growing (``is_overloaded``)
    in_system_mid: int  # requests arrived and not finished, midway through the window (information only:
    in_system_end: int  # ... at its end             a stable engine's batch fills for as long as its longest requests)
    waiting_start: float | None  # the mean number of requests waiting over the first quarter of the window ...
    waiting_end: float | None  # ... and the last (targets that report a queue; what the overload test compares)
    ttft_start: float | None  # without a queue: the typical TTFT (middle_mean) of the first quarter of measured requests ...
    ttft_end: float | None  # ... and the last (None below 32 measured requests: no overload verdict)
    max_waiting: int | None  # the most requests waiting at once (targets that report a queue)
    waiting_over_time: list[tuple[float, int]] | None  # (time, most waiting in that stretch), ~40 points
    num_measured: int
    probe: int = 0  # 1 for the first rate the search tried, 2 for the next, ...

    @property
    def ttft_p95(self) -> float:
        return self.latencies["ttft_p95"]

    def waiting_trend(self) -> str:
        """What the overload test compared, for the table: ``0.0->94.6`` (mean requests waiting in the
        window's first and last quarter), ``ttft 12->40ms`` for a target without a queue, else ``-``."""
        if self.waiting_start is not None:
            return f"{self.waiting_start:.1f}->{self.waiting_end:.1f}"
        if self.ttft_start is not None:
            return f"ttft {self.ttft_start * 1e3:.0f}->{self.ttft_end * 1e3:.0f}ms"
        return "-"

    @property
    def itl_p95(self) -> float:
        return self.latencies["itl_p95"]

    def to_dict(self) -> dict:
        out = {"rate": self.rate, "met": self.met, "violations": self.violations}
        out.update(self.latencies)
        for name in ("output_tokens_per_s", "requests_per_s", "goodput", "slo_attainment", "overloaded",
                     "in_system_mid", "in_system_end", "waiting_start", "waiting_end", "ttft_start", "ttft_end",
                     "max_waiting", "num_measured", "probe"):
            out[name] = getattr(self, name)
        out["waiting_over_time"] = [list(p) for p in self.waiting_over_time] if self.waiting_over_time else None
        return {k: _json_number(v) for k, v in out.items()}


def measured_slice(n: int, warmup: float, cooldown: float) -> slice:
    """The requests (by arrival order) whose latencies count: not the first ``warmup`` fraction,
    which find an empty engine, nor the last ``cooldown`` fraction, which find it draining (no
    arrivals behind them). Both would flatter the engine. At least one request always counts."""
    if not (0 <= warmup < 1 and 0 <= cooldown < 1 and warmup + cooldown < 1):
        raise ValueError(f"warmup and cooldown must be fractions >= 0 that leave requests to measure, got "
                         f"warmup={warmup}, cooldown={cooldown}")
    start, stop = int(n * warmup), n - int(n * cooldown)
    return slice(start, max(stop, start + 1))


def request_is_good(r: RequestResult, slos: Iterable[SLO]) -> bool:
    """Goodput's test of one request, as vLLM's serving benchmark makes it (``--goodput``, after
    DistServe): its own TTFT and e2e against their targets, and for ITL its TPOT (the request's
    mean ITL). A per-request percentile of a handful of gaps would mean little; the mean is what the
    user reads as the request's speed. (The rate's ``met`` uses pooled ITL percentiles instead.)"""
    own = {"ttft": r.ttft, "itl": r.tpot, "e2e": r.e2e}
    return all(not own[s.metric] > s.target for s in slos)  # NaN (a one-token request) has no ITL to break


def in_system(requests: list[RequestResult], t: float) -> int:
    """Requests that arrived before ``t`` and had not finished by then: waiting plus running
    (Little's N). Strictly before: the window ends at an arrival, which must not count itself."""
    return sum(r.arrival_time < t <= r.finish_time for r in requests)


def mean_waiting(waiting: list[tuple[float, int]], a: float, b: float) -> float:
    """The time-averaged number of waiting requests over ``[a, b]``. ``waiting`` holds ``(time,
    count)`` after each engine step; a count holds until the next entry (0 before the first)."""
    if not b > a:
        return 0.0
    total, count, t = 0.0, 0, a
    for time, n in waiting:
        if time <= a:
            count = n
            continue
        if time >= b:
            break
        total += count * (time - t)
        t, count = time, n
    total += count * (b - t)
    return total / (b - a)


def middle_mean(values) -> float:
    """The mean of the middle half of ``values`` (the lowest and highest quarter left out): a few
    stragglers do not move it, as with a median, yet a mix of fast and slow requests (two peaks)
    gives a value between them, where a median would jump from one peak to the other."""
    ordered = sorted(values)
    cut = len(ordered) // 4
    return float(np.mean(ordered[cut:len(ordered) - cut]))


def is_overloaded(requests: list[RequestResult], window: tuple[float, float],
                  waiting: list[tuple[float, int]] | None = None,
                  tolerance: float = OVERLOAD_TOLERANCE) -> tuple[bool, float | None, float | None]:
    """Arrivals outpacing completions: a queue that keeps growing, so that with a longer run latency
    would grow without bound (the percentiles of a finite run understate that).

    Not the number of requests *in the system* (arrived, not finished): a stable engine's running
    batch keeps filling until the run is longer than its longest requests (1,024-token generations
    take seconds), so that number rises in a short run with nothing queued. Growth that cannot go
    on forever shows up where nothing caps it:

    - **A target that reports its queue** (the simulator, a real engine): the running batch is
      capped by ``max_num_seqs`` and the KV pool, so an engine that cannot keep up piles requests
      into *waiting*. Compare the time-averaged waiting count over the first and the last quarter
      of the measurement window; overloaded when it grew by more than ``tolerance`` of the measured
      requests, and by more than 3 requests (a short run's random bunching of arrivals).
    - **A target that cannot see the queue** (an HTTP endpoint): a queue shows as time to first
      token. Compare the typical TTFT (``middle_mean``) of the last quarter of the measured requests
      with the first quarter's; overloaded when it more than doubled *and* rose by more than 50 ms. Below 32
      measured requests a quarter is too few to tell a trend from chance: no verdict (``None``
      trend), only the SLOs count.

    ``requests`` are the measured requests in arrival order, ``window`` the times of the first and
    last measured arrival. Returns ``(overloaded, start, end)``: the two waiting averages, or the
    two typical TTFTs (seconds) for a target without a queue, ``None`` when it gave no verdict."""
    start, end = window
    if waiting is not None:
        quarter = (end - start) / 4
        first, last = mean_waiting(waiting, start, start + quarter), mean_waiting(waiting, end - quarter, end)
        return last - first > max(MIN_QUEUE_GROWTH, tolerance * len(requests)), first, last
    if len(requests) < MIN_TREND_REQUESTS:
        return False, None, None
    quarter = len(requests) // 4
    first = middle_mean([r.ttft for r in requests[:quarter]])
    last = middle_mean([r.ttft for r in requests[-quarter:]])
    return last > TTFT_GROWTH * first and last - first > TTFT_GROWTH_FLOOR, first, last


def measure(run: TargetRun, rate: float, slos: Iterable[SLO], warmup: float = 0.1, cooldown: float = 0.1,
            overload_tolerance: float = OVERLOAD_TOLERANCE) -> RateResult:
    """Turn one run at ``rate`` into the numbers a capacity planner reads."""
    slos = tuple(slos)
    ordered = sorted(run.requests, key=lambda r: r.arrival_time)
    measured = ordered[measured_slice(len(ordered), warmup, cooldown)]
    start, end = measured[0].arrival_time, measured[-1].arrival_time
    if end <= start:  # one measured request, or all arriving at once: use the time it took to serve them
        end = max(r.finish_time for r in measured)
    duration = max(end - start, 1e-12)

    values = {"ttft": [r.ttft for r in measured], "itl": [g for r in measured for g in r.itl],
              "e2e": [r.e2e for r in measured], "tpot": [r.tpot for r in measured if r.itl]}
    wanted = sorted({*REPORTED_PERCENTILES, *(s.percentile for s in slos)})
    latencies = {f"{m}_p{p:g}": _percentile(v, p) for m, v in values.items() for p in wanted}

    tokens = np.concatenate([r.token_times() for r in ordered])
    delivered = int(np.count_nonzero((tokens >= start) & (tokens <= end)))
    finished = sum(start <= r.finish_time <= end for r in ordered)
    good = sum(request_is_good(r, slos) for r in measured)
    arrival_rate = max(len(measured) - 1, 1) / duration  # the load the window actually offered: n requests, n-1 gaps
    n_mid, n_end = in_system(ordered, (start + end) / 2), in_system(ordered, end)
    overloaded, trend_start, trend_end = is_overloaded(measured, (start, end), run.waiting, overload_tolerance)

    # NaN (nothing to measure: no request had two tokens, so no ITL) breaks no SLO, as in request_is_good
    violations = [s.name for s in slos if latencies[s.name] > s.target]
    if overloaded:
        violations.append("overload")
    waiting = run.waiting
    return RateResult(
        rate=rate, met=not violations, violations=violations, latencies=latencies,
        output_tokens_per_s=delivered / duration, requests_per_s=finished / duration, goodput=good / len(measured) * arrival_rate,
        slo_attainment=good / len(measured), overloaded=overloaded, in_system_mid=n_mid, in_system_end=n_end,
        waiting_start=trend_start if waiting is not None else None, waiting_end=trend_end if waiting is not None else None,
        ttft_start=trend_start if waiting is None else None, ttft_end=trend_end if waiting is None else None,
        max_waiting=max((n for _, n in waiting), default=0) if waiting is not None else None,
        waiting_over_time=downsample_waiting(waiting) if waiting is not None else None,
        num_measured=len(measured))


def downsample_waiting(waiting: list[tuple[float, int]], points: int = 40) -> list[tuple[float, int]]:
    """A long queue series (one entry per engine step) as ``points`` stretches of equal time, each
    with the most requests waiting in it: a peak never disappears between two samples."""
    if not waiting:
        return []
    times = np.array([t for t, _ in waiting])
    counts = np.array([n for _, n in waiting])
    edges = np.linspace(times[0], times[-1], points + 1)
    which = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, points - 1)
    peaks = np.full(points, -1)
    np.maximum.at(peaks, which, counts)
    return [(float(edges[i + 1]), int(peaks[i])) for i in range(points) if peaks[i] >= 0]


def _percentile(values, p: float) -> float:
    return float(np.percentile(values, p)) if len(values) else float("nan")


def _json_number(value):
    """NaN and infinity as ``null``: JSON has no such numbers."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


# --------------------------------------------------------------------------------------------------
# 4. The search
# --------------------------------------------------------------------------------------------------

DEFAULT_RATE_RANGE = (0.1, 512.0)
REL_TOL = 0.05
GROWTH = 2.0


def check_rate_range(rate_range) -> tuple[float, float]:
    """``(low, high)`` requests/s with 0 < low < high: a range holding a single rate leaves nothing
    to search (measure that rate with ``measure`` instead)."""
    try:
        low, high = (float(x) for x in rate_range)
    except (TypeError, ValueError):
        raise ValueError(f"rate range must be two numbers (low, high) in requests/s, got {rate_range!r}") from None
    if not (math.isfinite(low) and low > 0):
        raise ValueError(f"rate range: the lowest rate (low, --rate-min) must be a number > 0 requests/s, got {low:g}")
    if not (math.isfinite(high) and high > 0):
        raise ValueError(f"rate range: the highest rate (high, --rate-max) must be a finite number > 0 requests/s, "
                         f"got {high:g}")
    if high < low:
        raise ValueError(f"rate range ({low:g}, {high:g}) is inverted: the highest rate is below the lowest")
    if high == low:
        raise ValueError(f"rate range ({low:g}, {high:g}) is empty: the highest rate must be above the lowest")
    return low, high


def search_max_rate(is_met: Callable[[float], bool], low: float, high: float, rel_tol: float = REL_TOL,
                    growth: float = GROWTH) -> float | None:
    """The largest rate in ``[low, high]`` that ``is_met``, found as a galloping search: double the
    rate from ``low`` until one fails (or ``high`` passes), then halve the bracket (geometrically:
    rates span decades) until its ends are within ``rel_tol`` of each other. ``None`` when even
    ``low`` fails. At most about 1 + ceil(log2(high/low)) + ceil(log2(ln 2 / ln(1 + rel_tol))) calls
    (``low``, the doublings, the halvings of a bracket of ratio 2): 18 for the defaults.

    The answer only ever comes from the lower end of the bracket, which only moves up, to a rate that
    passed. So with an ``is_met`` that passes wherever a stricter one passes (a looser SLO on the
    same measurements), the two searches tread the same rates until the first rate where they
    disagree; the loose one keeps it and ends at or above it, the strict one ends below it. Loosening
    an SLO can never lower the capacity, even where latency is not monotone in the rate."""
    low, high = check_rate_range((low, high))
    if not (rel_tol > 0 and growth > 1):
        raise ValueError(f"rel_tol must be > 0 and growth > 1, got rel_tol={rel_tol}, growth={growth}")
    if not is_met(low):
        return None
    lo = low
    while True:  # gallop up
        if lo >= high:
            return high
        nxt = min(lo * growth, high)
        if not is_met(nxt):
            hi = nxt
            break
        lo = nxt
    while hi > lo * (1 + rel_tol):  # bisect the bracket [lo passes, hi fails]
        mid = math.sqrt(lo * hi)
        if is_met(mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class CapacityResult:
    """The capacity search's answer and every rate it tried (sorted by rate)."""

    max_rate: float | None  # the largest rate that met every SLO; None: not even the lowest did
    slo: tuple[SLO, ...]
    rates: list[RateResult]
    engine: str = ""
    target: str = ""
    mix: str = DEFAULT_MIX
    num_requests: int = 0
    seed: int = 0
    burstiness: float = 1.0
    rate_range: tuple[float, float] = DEFAULT_RATE_RANGE
    rel_tol: float = REL_TOL
    engine_options: dict = field(default_factory=dict)

    def at(self, rate: float) -> RateResult:
        """The entry of a rate the search tried."""
        return next(r for r in self.rates if r.rate == rate)

    @property
    def first_failure(self) -> RateResult | None:
        """The lowest rate above ``max_rate`` that failed: what broke first."""
        above = [r for r in self.rates if not r.met and (self.max_rate is None or r.rate > self.max_rate)]
        return min(above, key=lambda r: r.rate, default=None)

    def summary(self) -> str:
        """One line: the capacity, and what broke just above it."""
        fail = self.first_failure
        low = self.rate_range[0]
        if self.max_rate is None:
            return (f"no rate met every SLO: even {low:g} req/s broke {', '.join(fail.violations)} "
                    f"(try a lower --rate-min)")
        text = f"max rate meeting every SLO: {self.max_rate:.3g} req/s"
        if fail is None:
            text += " (the top of the range searched: the capacity may be higher; raise --rate-max)"
        else:
            text += f" (at {fail.rate:.3g} req/s it broke {', '.join(fail.violations)})"
        return text + self.short_run_warning()

    def short_run_warning(self) -> str:
        """A caution when the run at ``max_rate`` was shorter than its slowest requests lasted: the
        batch was still filling when the arrivals stopped, so the engine never reached the steady
        state a longer run would (more running requests, slower steps, perhaps a queue). Such a run
        cannot show a throughput limit, and the capacity may be overstated. '' when it was long enough."""
        if self.max_rate is None:
            return ""
        r = self.at(self.max_rate)
        window, slowest = (r.num_measured - 1) / r.rate, r.latencies["e2e_p99"]
        if not window < slowest:
            return ""
        return (f"; caution: the measured arrivals at that rate span {window:.2g} s, less than its slowest requests "
                f"take (e2e p99 {slowest:.2g} s): the engine never reached a steady state, so the capacity may be "
                "overstated; raise --num-requests")

    def table(self) -> str:
        """One row per rate tried, sorted by rate, then the summary line."""
        names = ["ttft_p95", "itl_p95"] + [s.name for s in self.slo if s.name not in ("ttft_p95", "itl_p95")]
        header = (f"{'rate req/s':>10} {'met':>4} " + " ".join(f"{n + ' ms':>13}" for n in names)
                  + f" {'out tok/s':>10} {'goodput/s':>9} {'waiting':>11}  broke")
        slo_line = ", ".join(f"{s.name} <= {s.target * 1e3:g} ms" for s in self.slo)
        lines = [f"capacity of engine {self.engine!r} ({self.target}), mix {self.mix!r}, {self.num_requests} requests "
                 f"per rate, seed {self.seed}" + ("" if self.burstiness == 1 else f", burstiness {self.burstiness:g}"),
                 f"SLOs: {slo_line}", "", header, "-" * len(header)]
        for r in self.rates:
            lat = " ".join(f"{r.latencies[n] * 1e3:>13.1f}" for n in names)
            lines.append(f"{r.rate:>10.3g} {'yes' if r.met else 'no':>4} {lat} {r.output_tokens_per_s:>10.0f} "
                         f"{r.goodput:>9.2f} {r.waiting_trend():>11}  {', '.join(r.violations)}")
        lines += ["", self.summary()]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"max_rate": self.max_rate, "slo": {s.name: s.target for s in self.slo},
                "rates": [r.to_dict() for r in self.rates], "engine": self.engine, "target": self.target,
                "mix": self.mix, "num_requests": self.num_requests, "seed": self.seed, "burstiness": self.burstiness,
                "rate_range": list(self.rate_range), "rel_tol": self.rel_tol,
                "engine_options": {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
                                   for k, v in self.engine_options.items()}}

    def to_json(self, path=None) -> str:
        """The result as JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text


def find_capacity(engine: str = "chunked", slo=None, *, profile=None, model=None, mix=DEFAULT_MIX,
                  num_requests: int = 500, rate_range=DEFAULT_RATE_RANGE, seed: int = 0, bursty: bool = False,
                  burstiness: float | None = None, target: Target | None = None, rel_tol: float = REL_TOL,
                  warmup: float = 0.1, cooldown: float = 0.1, overload_tolerance: float = OVERLOAD_TOLERANCE,
                  progress: Callable[[RateResult], None] | None = None,
                  search: Callable[..., float | None] = search_max_rate, **engine_options) -> CapacityResult:
    """The largest arrival rate (requests/s) at which ``engine`` meets every SLO in ``slo``.

    What is measured: the simulator with ``profile`` (the default, ``"h200-qwen3-0.6b"``), a real
    engine on ``model`` (``LLM(model, engine=engine, **engine_options)``), or any ``target``.
    ``engine_options`` go to the engine (``max_num_seqs=64``, ``max_num_batched_tokens=2048``, ...).
    Every rate replays the same ``num_requests`` requests of ``mix`` (seeded), compressed in time;
    ``bursty=True`` (or ``burstiness`` < 1) sends them in bursts. ``progress`` is called with each
    rate's result as it comes. ``search(is_met, low, high, rel_tol)`` finds the rate: by default
    ``search_max_rate``; chapter 7's exercise plugs in the learner's own. Deterministic for a seed on
    a deterministic target (the simulator)."""
    slos = parse_slos(slo)
    low, high = check_rate_range(rate_range)
    if burstiness is None:
        burstiness = BURSTY if bursty else 1.0
    if profile is not None and model is not None:
        raise ValueError("profile and model: give one (profile runs the simulator, model a real engine)")
    if target is not None and (profile is not None or model is not None or engine_options):
        raise ValueError("target: a target of your own is already built: give neither profile, model nor engine options")
    if not rel_tol > 0:
        raise ValueError(f"rel_tol must be > 0, got {rel_tol}")
    measured_slice(num_requests, warmup, cooldown)  # bad fractions fail before anything runs
    if target is None:
        if model is not None:
            from minillm.llm import LLM

            llm = LLM(model, engine=engine, **engine_options)
            target = llm_target(llm)
            target.description = f"real engine, model {model!r} on {llm.device}"
        else:
            target = simulator_target(engine, profile or "h200-qwen3-0.6b", **engine_options)
    base = base_workload(mix, num_requests, seed, burstiness)

    tried: dict[float, RateResult] = {}

    def is_met(rate: float) -> bool:
        if rate not in tried:
            result = measure(target(at_rate(base, rate)), rate, slos, warmup, cooldown, overload_tolerance)
            result.probe = len(tried) + 1
            tried[rate] = result
            if progress is not None:
                progress(result)
        return tried[rate].met

    max_rate = search(is_met, low, high, rel_tol)
    return CapacityResult(max_rate, slos, sorted(tried.values(), key=lambda r: r.rate), engine=engine,
                          target=getattr(target, "description", "a target of your own"),
                          mix=mix if isinstance(mix, str) else "custom", num_requests=num_requests, seed=seed,
                          burstiness=burstiness, rate_range=(low, high), rel_tol=rel_tol, engine_options=engine_options)
