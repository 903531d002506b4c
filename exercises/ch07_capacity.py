# Generated from solutions/ch07_capacity.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: e40eb93c05482a7b
"""Chapter 7, the capstone: the largest arrival rate that still meets the latency targets.

A capacity planner states the experience users must get as service-level objectives (SLOs), such
as "95% of requests see their first token within 0.5 s" (``ttft_p95=0.5``), replays a
representative workload at one arrival rate after another, and reports the largest rate at which
every SLO still holds. ``minillm.capacity.find_capacity`` does all of it; two of its pieces are yours:

* ``request_is_good``: is one request *good*? Goodput (DistServe; vLLM's serving benchmark,
  ``--goodput``) counts the requests per second that met every target of their own, as opposed to
  throughput, which counts every request however late;
* ``find_max_rate``: the search for the largest rate that meets the targets. Each rate tried is a
  whole benchmark run, so it must try few rates: a search, not a grid.

Plug your search into the real tool and it sizes the simulated H200 endpoint with it::

    from minillm.capacity import find_capacity
    result = find_capacity("chunked", ["ttft_p95=0.5", "itl_p95=0.05"], search=find_max_rate)
    print(result.table())

``check("ch07")`` grades both functions: on made-up requests and made-up ``is_met`` functions
whose capacity it knows, then inside ``find_capacity`` on the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def request_is_good(ttft: float, itls: list[float], e2e: float, slos: dict[str, float]) -> bool:
    """Whether one request met every SLO given, judged on its own numbers (goodput's rule).

    ``ttft``: seconds from the request's arrival to its first token; ``itls``: the gaps between its
    consecutive tokens, in seconds (``[]`` for a request of one token); ``e2e``: seconds from its
    arrival to its last token. ``slos`` maps a metric to its target in seconds, and holds any of
    ``"ttft"``, ``"itl"`` and ``"e2e"``; a metric absent from ``slos`` has no target and is not checked.

    The request is good when each metric in ``slos`` is *at most* its target (equal is good):

    * ``"ttft"``: its ``ttft``;
    * ``"itl"``: the MEAN of its ``itls`` (its time per output token, TPOT), not its longest gap.
      A request with no gaps (one token) meets any ITL target;
    * ``"e2e"``: its ``e2e``.

    Example: ``request_is_good(0.3, [0.02, 0.02, 0.08], 0.42, {"ttft": 0.5, "itl": 0.05})`` is
    ``True``: TTFT 0.3 <= 0.5, mean gap 0.04 <= 0.05 (the 0.08 gap alone does not break it), and
    e2e has no target. With ``{"ttft": 0.25}`` it is ``False``.
    """
    raise NotImplementedError("write request_is_good: whether one request met every target it is given")


def find_max_rate(is_met: Callable[[float], bool], low: float, high: float, rel_tol: float = 0.05) -> float | None:
    """The largest rate in ``[low, high]`` (requests/s) for which ``is_met(rate)`` is True.

    ``is_met(rate)`` runs a whole benchmark at ``rate`` and says whether every SLO held. Assume it
    is True up to some rate, the capacity, and False above it. ``0 < low < high``, ``rel_tol > 0``.

    * ``is_met(low)`` is False: not even the lowest rate meets the targets; return ``None``.
    * ``is_met(high)`` is True: return ``high`` (the capacity may be higher: the range ends there).
    * Otherwise return a rate ``r`` that you called ``is_met`` with and that it said True to, and
      that is within ``rel_tol`` below the capacity: ``r * (1 + rel_tol)`` is above it. A rate
      that failed (the capacity is below it) is never the answer.

    Call ``is_met`` only with rates in ``[low, high]``, and at most
    ``log2(high / low) + log2(1 / rel_tol) + 4`` times: each call is a benchmark run, so a grid
    that steps through the range is far too slow.

    Example: capacity 10 req/s, i.e. ``is_met = lambda rate: rate <= 10``, ``low=1``, ``high=64``,
    ``rel_tol=0.05``: any rate in ``(10 / 1.05, 10]`` that ``is_met`` said True to is a right answer
    (9.93, say), found in at most 14 calls. With ``low=12`` the answer is ``None``; with ``high=9``,
    ``9``.
    """
    raise NotImplementedError("write find_max_rate: the largest rate that meets the targets, within rel_tol")


# The tool's own search is ``minillm.capacity.search_max_rate`` (the same galloping search, which
# also lets you choose the growth factor); the notebook shows it after this exercise.
