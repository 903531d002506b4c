"""Chapter 8, step 2: a representative workload -- a named request mix, replayed at any arrival rate.

Every rate replays the *same* requests (lengths drawn from a seed) with their arrival times compressed:
two rates differ in load and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minillm.workloads import LENGTH_MIXES, Workload, draw_lengths, fixed, uniform

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


def capacity_workload(
    mix=DEFAULT_MIX,
    num_requests: int = 500,
    rate: float = 1.0,
    seed: int = 0,
    burstiness: float = 1.0,
    vocab_size: int = 256,
) -> Workload:
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
