# Generated from solutions/ch08_capacity.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: af33ec70b1f33c36
"""Chapter 8, the capstone: the largest arrival rate that still meets the latency targets.

A capacity planner states the experience users must get as service-level objectives (SLOs), such
as "95% of requests see their first token within 0.5 s" (``ttft_p95=0.5``), replays a
representative workload at one arrival rate after another, and reports the largest rate at which
every SLO still holds. ``minillm.capacity.find_capacity`` does all of it; the search over rates is
the tool's (a bisection), and three of the judgements it rests on are yours:

* ``request_is_good``: is one request *good*? Goodput (DistServe; vLLM's serving benchmark,
  ``--goodput``) counts the requests per second that met every target of their own, as opposed to
  throughput, which counts every request however late;
* ``measured_slice``: which requests of a run count. The first ones find an empty engine, the last
  ones an engine that is draining; both flatter it;
* ``queue_grew``: is the engine overloaded? A finite run's percentiles can meet the targets while
  the queue grows step after step: a longer run would not.

``check("ch08")`` grades them on made-up cases, then on runs of the simulated H200 endpoint
against ``minillm.capacity``'s own judgement.
"""

from __future__ import annotations


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


def measured_slice(num_requests: int, warmup: float, cooldown: float) -> slice:
    """The requests of a run, by arrival order, whose latencies count: a slice of
    ``range(num_requests)``.

    The first ``warmup`` fraction of the requests and the last ``cooldown`` fraction do not count,
    each fraction of ``num_requests`` rounded down to whole requests. ``warmup`` and ``cooldown`` must
    be at least 0 and leave requests to measure (each below 1, and their sum below 1); otherwise
    raise ``ValueError`` with a message that names ``warmup`` and ``cooldown`` and their values.

    Examples: ``measured_slice(100, 0.1, 0.1)`` keeps requests 10 to 89; ``measured_slice(9, 0.15,
    0.15)`` requests 1 to 7 (1.35 requests round down to 1); ``measured_slice(5, 0.0, 0.0)`` all
    five; ``measured_slice(10, 0.5, 0.5)`` raises ``ValueError``.
    """
    raise NotImplementedError("write measured_slice: the requests of a run whose latencies count")


def queue_grew(
    waiting: list[tuple[float, int]], start: float, end: float, num_requests: int
) -> tuple[bool, float, float]:
    """Whether a run's queue kept growing through its measurement window ``[start, end]``
    (``end > start``): arrivals outpacing what the engine finishes, so that a longer run would see
    its latencies grow without bound. Returns ``(grew, first, last)``.

    * ``waiting`` lists ``(time, count)`` pairs in time order: the number of requests waiting after
      each engine step. A count holds from its time until the next pair's; before the first pair,
      nobody waits.
    * ``first`` and ``last``: the time-averaged number of waiting requests over the window's first
      quarter, ``[start, start + (end - start) / 4]``, and over its last quarter,
      ``[end - (end - start) / 4, end]``.
    * ``grew``: ``last`` exceeds ``first`` by more than 3 requests and by more than 5% of
      ``num_requests`` (the measured requests): a short run's bunched arrivals make a little growth
      by chance.

    Example: ``queue_grew([(0.0, 0), (1.0, 2), (3.0, 8)], 0.0, 4.0, 40)`` is ``(True, 0.0, 8.0)``:
    nobody waits through ``[0, 1]``, eight through ``[3, 4]``, and 8 is more than 3 (and than 2)
    above 0. Over ``[0, 2]`` the first quarter is ``[0, 0.5]``, the last ``[1.5, 2]``: ``(False, 0.0,
    2.0)``.
    """

    raise NotImplementedError("write queue_grew: whether a run's queue kept growing")
