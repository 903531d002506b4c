"""Chapter 8, step 1: service-level objectives -- the experience a capacity is measured against.

``ttft_p95=0.5`` says "95% of requests see their first token within 0.5 s". ``parse_slo`` reads one
such string, ``parse_slos`` every form the capacity tool takes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

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
        raise ValueError(
            f"{where}: unknown metric {name!r}; use ttft, itl or e2e with a percentile pNN "
            "(0 < NN < 100), e.g. ttft_p95, itl_p50, e2e_p99.9"
        )
    if not 0 < percentile < 100:
        raise ValueError(
            f"{where}: the percentile of {name} must be above 0 and below 100 (p0.5, p50, p99.9, ...), "
            f"got {percentile:g}"
        )
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
