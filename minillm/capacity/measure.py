"""Chapter 8, step 3: one arrival rate -- throughput, the queue, latency percentiles, goodput, overload.

``measure`` turns a target's run at one rate into the numbers a capacity planner reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from minillm.capacity.slo import SLO
from minillm.capacity.targets import RequestResult, TargetRun

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
    arrival_rate: float  # requests that arrived during the window, per second (the load it actually offered)
    goodput: float  # requests/s that met every SLO of their own: slo_attainment x arrival_rate
    slo_attainment: float  # the fraction of measured requests that met every SLO
    overloaded: bool  # the queue kept growing (``is_overloaded``)
    in_system_mid: int  # requests arrived and not finished, midway through the window (information only:
    in_system_end: int  # ... at its end             a stable engine's batch fills for as long as its longest requests)
    waiting_start: float | None  # the mean number of requests waiting over the first quarter of the window ...
    waiting_end: float | None  # ... and the last (targets that report a queue; what the overload test compares)
    ttft_start: (
        float | None
    )  # without a queue: the typical TTFT (middle_mean) of the first quarter of measured requests ...
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
        for name in (
            "output_tokens_per_s",
            "requests_per_s",
            "goodput",
            "slo_attainment",
            "overloaded",
            "in_system_mid",
            "in_system_end",
            "waiting_start",
            "waiting_end",
            "ttft_start",
            "ttft_end",
            "max_waiting",
            "num_measured",
            "probe",
        ):
            out[name] = getattr(self, name)
        out["waiting_over_time"] = [list(p) for p in self.waiting_over_time] if self.waiting_over_time else None
        return {k: _json_number(v) for k, v in out.items()}


def measured_slice(n: int, warmup: float, cooldown: float) -> slice:
    """The requests (by arrival order) whose latencies count: not the first ``warmup`` fraction,
    which find an empty engine, nor the last ``cooldown`` fraction, which find it draining (no
    arrivals behind them). Both would flatter the engine. At least one request always counts."""
    if not (0 <= warmup < 1 and 0 <= cooldown < 1 and warmup + cooldown < 1):
        raise ValueError(
            f"warmup and cooldown must be fractions >= 0 that leave requests to measure, got "
            f"warmup={warmup}, cooldown={cooldown}"
        )
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
    return float(np.mean(ordered[cut : len(ordered) - cut]))


def is_overloaded(
    requests: list[RequestResult],
    window: tuple[float, float],
    waiting: list[tuple[float, int]] | None = None,
    tolerance: float = OVERLOAD_TOLERANCE,
) -> tuple[bool, float | None, float | None]:
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


def measure(
    run: TargetRun,
    rate: float,
    slos: Iterable[SLO],
    warmup: float = 0.1,
    cooldown: float = 0.1,
    overload_tolerance: float = OVERLOAD_TOLERANCE,
) -> RateResult:
    """Turn one run at ``rate`` into the numbers a capacity planner reads."""
    slos = tuple(slos)
    ordered = sorted(run.requests, key=lambda r: r.arrival_time)
    measured = ordered[measured_slice(len(ordered), warmup, cooldown)]
    start, end = measured[0].arrival_time, measured[-1].arrival_time
    if end <= start:  # one measured request, or all arriving at once: use the time it took to serve them
        end = max(r.finish_time for r in measured)
    duration = max(end - start, 1e-12)

    values = {
        "ttft": [r.ttft for r in measured],
        "itl": [g for r in measured for g in r.itl],
        "e2e": [r.e2e for r in measured],
        "tpot": [r.tpot for r in measured if r.itl],
    }
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
        rate=rate,
        met=not violations,
        violations=violations,
        latencies=latencies,
        output_tokens_per_s=delivered / duration,
        requests_per_s=finished / duration,
        arrival_rate=arrival_rate,
        goodput=good / len(measured) * arrival_rate,
        slo_attainment=good / len(measured),
        overloaded=overloaded,
        in_system_mid=n_mid,
        in_system_end=n_end,
        waiting_start=trend_start if waiting is not None else None,
        waiting_end=trend_end if waiting is not None else None,
        ttft_start=trend_start if waiting is None else None,
        ttft_end=trend_end if waiting is None else None,
        max_waiting=max((n for _, n in waiting), default=0) if waiting is not None else None,
        waiting_over_time=downsample_waiting(waiting) if waiting is not None else None,
        num_measured=len(measured),
    )


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
