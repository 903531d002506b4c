"""Chapter 8, step 4: raise the rate until an SLO breaks -- a galloping search, not a grid, over the
rates where the engine also is not overloaded (``find_capacity``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from minillm.capacity.measure import OVERLOAD_TOLERANCE, RateResult, measure, measured_slice
from minillm.capacity.mixes import BURSTY, DEFAULT_MIX, at_rate, base_workload
from minillm.capacity.slo import SLO, parse_slos
from minillm.capacity.targets import Target, llm_target, simulator_target
from minillm.llm import LLM

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
        raise ValueError(
            f"rate range: the highest rate (high, --rate-max) must be a finite number > 0 requests/s, got {high:g}"
        )
    if high < low:
        raise ValueError(f"rate range ({low:g}, {high:g}) is inverted: the highest rate is below the lowest")
    if high == low:
        raise ValueError(f"rate range ({low:g}, {high:g}) is empty: the highest rate must be above the lowest")
    return low, high


def search_max_rate(
    is_met: Callable[[float], bool], low: float, high: float, rel_tol: float = REL_TOL, growth: float = GROWTH
) -> float | None:
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
            return (
                f"no rate met every SLO: even {low:g} req/s broke {', '.join(fail.violations)} (try a lower --rate-min)"
            )
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
        return (
            f"; caution: the measured arrivals at that rate span {window:.2g} s, less than its slowest requests "
            f"take (e2e p99 {slowest:.2g} s): the engine never reached a steady state, so the capacity may be "
            "overstated; raise --num-requests"
        )

    def table(self) -> str:
        """One row per rate tried, sorted by rate, then the summary line."""
        names = ["ttft_p95", "itl_p95"] + [s.name for s in self.slo if s.name not in ("ttft_p95", "itl_p95")]
        header = (
            f"{'rate req/s':>10} {'met':>4} "
            + " ".join(f"{n + ' ms':>13}" for n in names)
            + f" {'out tok/s':>10} {'goodput/s':>9} {'waiting':>11}  broke"
        )
        slo_line = ", ".join(f"{s.name} <= {s.target * 1e3:g} ms" for s in self.slo)
        lines = [
            f"capacity of engine {self.engine!r} ({self.target}), mix {self.mix!r}, {self.num_requests} requests "
            f"per rate, seed {self.seed}" + ("" if self.burstiness == 1 else f", burstiness {self.burstiness:g}"),
            f"SLOs: {slo_line}",
            "",
            header,
            "-" * len(header),
        ]
        for r in self.rates:
            lat = " ".join(f"{r.latencies[n] * 1e3:>13.1f}" for n in names)
            lines.append(
                f"{r.rate:>10.3g} {'yes' if r.met else 'no':>4} {lat} {r.output_tokens_per_s:>10.0f} "
                f"{r.goodput:>9.2f} {r.waiting_trend():>11}  {', '.join(r.violations)}"
            )
        lines += ["", self.summary()]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "max_rate": self.max_rate,
            "slo": {s.name: s.target for s in self.slo},
            "rates": [r.to_dict() for r in self.rates],
            "engine": self.engine,
            "target": self.target,
            "mix": self.mix,
            "num_requests": self.num_requests,
            "seed": self.seed,
            "burstiness": self.burstiness,
            "rate_range": list(self.rate_range),
            "rel_tol": self.rel_tol,
            "engine_options": {
                k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
                for k, v in self.engine_options.items()
            },
        }

    def to_json(self, path=None) -> str:
        """The result as JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text


def find_capacity(
    engine: str = "chunked",
    slo=None,
    *,
    profile=None,
    model=None,
    mix=DEFAULT_MIX,
    num_requests: int = 500,
    rate_range=DEFAULT_RATE_RANGE,
    seed: int = 0,
    bursty: bool = False,
    burstiness: float | None = None,
    target: Target | None = None,
    rel_tol: float = REL_TOL,
    warmup: float = 0.1,
    cooldown: float = 0.1,
    overload_tolerance: float = OVERLOAD_TOLERANCE,
    progress: Callable[[RateResult], None] | None = None,
    search: Callable[..., float | None] = search_max_rate,
    **engine_options,
) -> CapacityResult:
    """The largest arrival rate (requests/s) at which ``engine`` meets every SLO in ``slo``.

    What is measured: the simulator with ``profile`` (the default, ``"h200-qwen3-0.6b"``), a real
    engine on ``model`` (``LLM(model, engine=engine, **engine_options)``), or any ``target``.
    ``engine_options`` go to the engine (``max_num_seqs=64``, ``max_num_batched_tokens=2048``, ...).
    Every rate replays the same ``num_requests`` requests of ``mix`` (seeded), compressed in time;
    ``bursty=True`` (or ``burstiness`` < 1) sends them in bursts. ``progress`` is called with each
    rate's result as it comes. ``search(is_met, low, high, rel_tol)`` finds the rate: by default
    ``search_max_rate``, or any function of that signature. Deterministic for a seed on
    a deterministic target (the simulator)."""
    slos = parse_slos(slo)
    low, high = check_rate_range(rate_range)
    if burstiness is None:
        burstiness = BURSTY if bursty else 1.0
    if profile is not None and model is not None:
        raise ValueError("profile and model: give one (profile runs the simulator, model a real engine)")
    if target is not None and (profile is not None or model is not None or engine_options):
        raise ValueError(
            "target: a target of your own is already built: give neither profile, model nor engine options"
        )
    if not rel_tol > 0:
        raise ValueError(f"rel_tol must be > 0, got {rel_tol}")
    measured_slice(num_requests, warmup, cooldown)  # bad fractions fail before anything runs
    if target is None:
        if model is not None:
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
    return CapacityResult(
        max_rate,
        slos,
        sorted(tried.values(), key=lambda r: r.rate),
        engine=engine,
        target=getattr(target, "description", "a target of your own"),
        mix=mix if isinstance(mix, str) else "custom",
        num_requests=num_requests,
        seed=seed,
        burstiness=burstiness,
        rate_range=(low, high),
        rel_tol=rel_tol,
        engine_options=engine_options,
    )
