"""Latency metrics, named as vLLM names them, computed from per-request timestamps.

All times are seconds since ``generate`` started. A request's clock starts at its *arrival*, so
queueing counts against it exactly as a user would feel it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per generated token
    finished_time: float | None = None
    first_token_step: int | None = None  # engine step that produced the first token
    finished_step: int | None = None  # engine step that produced the last token

    @property
    def queue_time(self) -> float:
        """Waiting before the engine first ran any of this request."""
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float:
        """Time to first token: queueing plus prefill."""
        return self.first_token_time - self.arrival_time

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive generated tokens."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def e2e(self) -> float:
        """End-to-end latency: arrival to last token."""
        return self.finished_time - self.arrival_time


def percentiles(values, ps=(50, 95, 99)) -> dict[str, float]:
    """``{"p50": ..., "p95": ..., "p99": ...}``; NaN for an empty list."""
    values = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
    return {f"p{p}": float(np.percentile(values, p)) if values.size else float("nan") for p in ps}


def percentile_note(p: float, n: int) -> str:
    """What ``p``-th percentile means over ``n`` values, in words, for the text a notebook prints.

    ``percentiles`` uses numpy's default (linear) rule: sorted, the values sit at ranks 0 .. n-1 and
    the pXX is read at rank XX/100 * (n-1), between the two values either side of it. So over a
    handful of values a tail percentile is (almost) the largest value, not a statement about 5% or
    1% of many requests."""
    if n <= 0:
        return f"p{p:g} is undefined: there are no values"
    if n == 1:
        return f"with a single value, p{p:g} is that value"
    rank = p / 100 * (n - 1)
    lower = int(rank)
    frac = rank - lower
    if frac < 1e-9:
        place = "the largest value" if lower == n - 1 else f"the {_ordinal(lower + 1)}-smallest value"
        return f"over {n} values, p{p:g} is {place}"
    upper = "the largest" if lower + 1 == n - 1 else f"the {_ordinal(lower + 2)}-smallest"
    return (
        f"over {n} values, p{p:g} lies {frac:.0%} of the way from the {_ordinal(lower + 1)}-smallest value to {upper}"
    )


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def time_per_output_token(outputs) -> list[float]:
    """Each request's mean inter-token latency (TPOT: vLLM's ``request_time_per_output_token``), one
    value per request that produced at least two tokens. The per-request view beside ITL, whose
    percentiles pool every gap of every request, so a long answer weighs more than a short one."""
    # The gaps telescope: their mean is (last token - first token) / (tokens - 1).
    return [(t[-1] - t[0]) / (len(t) - 1) for t in (o.metrics.token_times for o in outputs) if len(t) > 1]


def longest_gap(outputs) -> float:
    """The longest gap between two tokens of any of these requests, in seconds (0.0 if none had
    two tokens): the stall a user watching the stream sees, which percentiles of ITL can hide."""
    return max((gap for o in outputs for gap in o.metrics.itl), default=0.0)


def summarize(outputs, trace=None) -> dict:
    """Aggregate metrics of one ``generate`` call, keyed by vLLM's metric names."""
    ms = [o.metrics for o in outputs]
    ttft = [m.ttft for m in ms]
    itl = [gap for m in ms for gap in m.itl]
    e2e = [m.e2e for m in ms]
    queue = [m.queue_time for m in ms]
    num_generated = sum(len(o.token_ids) for o in outputs)
    num_prompt = sum(len(o.prompt_token_ids) for o in outputs)
    start = min(m.arrival_time for m in ms)
    duration = max(m.finished_time for m in ms) - start
    summary = {
        "num_requests": len(outputs),
        "prompt_tokens": num_prompt,
        "generation_tokens": num_generated,
        "duration_seconds": duration,
        "output_throughput_tokens_per_second": num_generated / duration if duration > 0 else float("nan"),
        "request_throughput_per_second": len(outputs) / duration if duration > 0 else float("nan"),
        "time_to_first_token_seconds": _distribution(ttft),
        "inter_token_latency_seconds": _distribution(itl),
        "request_time_per_output_token_seconds": _distribution(time_per_output_token(outputs)),
        "e2e_request_latency_seconds": _distribution(e2e),
        "request_queue_time_seconds": _distribution(queue),
    }
    if trace is not None and len(trace):
        running, waiting = trace.column("num_running"), trace.column("num_waiting")
        summary["num_requests_running"] = {"mean": _mean(running), "max": max(running)}
        summary["num_requests_waiting"] = {"mean": _mean(waiting), "max": max(waiting)}
    return summary


def _distribution(values: list[float]) -> dict[str, float]:
    """Mean and percentiles, from one array (ITL has a value per generated token: millions in a
    long simulation, worth converting once)."""
    values = np.asarray(values, dtype=float)
    return {"mean": float(values.mean()) if values.size else float("nan"), **percentiles(values)}


def _mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else float("nan")


def request_table(outputs) -> str:
    """One line per request: prompt and output tokens, TTFT, mean ITL, e2e (milliseconds)."""
    header = (
        f"{'request':>8} {'prompt':>7} {'output':>7} {'queue ms':>9} {'TTFT ms':>9} {'mean ITL ms':>12} {'e2e ms':>9}"
        "  finish"
    )
    lines = [header, "-" * len(header)]
    for o in outputs:
        m = o.metrics
        itl = _mean(m.itl)
        lines.append(
            f"{o.request_id:>8} {len(o.prompt_token_ids):>7} {len(o.token_ids):>7} {m.queue_time * 1e3:>9.1f} "
            f"{m.ttft * 1e3:>9.1f} {itl * 1e3:>12.2f} {m.e2e * 1e3:>9.1f}  {o.finish_reason}"
        )
    return "\n".join(lines)


def summary_table(summary: dict) -> str:
    """The latency distributions of ``summarize`` as a small table (milliseconds)."""
    rows = [
        ("TTFT", "time_to_first_token_seconds"),
        ("ITL", "inter_token_latency_seconds"),
        ("TPOT", "request_time_per_output_token_seconds"),
        ("e2e", "e2e_request_latency_seconds"),
        ("queue", "request_queue_time_seconds"),
    ]
    lines = [f"{'metric':<6} {'mean ms':>9} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9}"]
    for label, key in rows:
        d = summary[key]
        lines.append(f"{label:<6} " + " ".join(f"{d[k] * 1e3:>9.2f}" for k in ("mean", "p50", "p95", "p99")))
    lines.append("TPOT: each request's mean ITL, one value per request; ITL: every gap of every request, pooled")
    lines.append(
        f"{summary['num_requests']} requests, {summary['generation_tokens']} output tokens in "
        f"{summary['duration_seconds']:.2f} s: {summary['output_throughput_tokens_per_second']:.1f} output tok/s"
    )
    return "\n".join(lines)
