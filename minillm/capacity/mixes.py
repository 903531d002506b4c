"""Chapter 8, step 2: a representative workload -- a named request mix, replayed at any arrival rate.

Every rate replays the *same* requests (lengths drawn from a seed) with their arrival times compressed:
two rates differ in load and nothing else.

Most mixes are random token ids, so no request repeats another's tokens. Real traffic repeats itself
(a system prompt on every request, a chat that resends its history), which is what a prefix cache
(``enable_prefix_caching=True``) skips: the mixes named in ``SYSTEM_PROMPT_LENS`` and ``NUM_TURNS``
repeat tokens that way.
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
CPU_CHAT = (1.0, uniform(8, 32), uniform(4, 16))  # short enough for the tiny model on a laptop CPU

MIXES: dict[str, list[tuple[float, Callable, Callable]]] = {
    "chat": [CHAT],
    "long prompts": [LONG_PROMPT],
    "long generations": [LONG_GENERATION],
    # what a shared endpoint sees: mostly chat, a few of each heavy kind
    "mixed": [(0.8, *CHAT[1:]), (0.1, *LONG_PROMPT[1:]), (0.1, *LONG_GENERATION[1:])],
    # short enough for a real model on a laptop CPU (the tiny model's 2,048 positions included)
    "cpu chat": [CPU_CHAT],
    # traffic that repeats itself; the lengths here are each request's own message and answer
    "chat + system prompt": [CHAT],
    "cpu chat + system prompt": [CPU_CHAT],
    "multi-turn chat": [CHAT],
    "cpu multi-turn chat": [CPU_CHAT],
}
# Every request of these mixes starts with the same system prompt, this many tokens long ...
SYSTEM_PROMPT_LENS = {"chat + system prompt": 1000, "cpu chat + system prompt": 256}
# ... and the requests of these are the turns of chats that resend their history, this many turns a chat.
NUM_TURNS = {"multi-turn chat": 4, "cpu multi-turn chat": 4}
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
    workload = fixed(prompt_lens, output_lens, times, vocab_size, seed)
    name = mix if isinstance(mix, str) else None
    rng = np.random.default_rng([seed, 2])  # a stream of its own: the lengths and arrivals keep theirs
    if name in SYSTEM_PROMPT_LENS:
        system_prompt = rng.integers(0, vocab_size, size=SYSTEM_PROMPT_LENS[name]).tolist()
        workload.prompts = [system_prompt + prompt for prompt in workload.prompts]
    if name in NUM_TURNS:
        workload.prompts = resend_history(workload.prompts, output_lens, NUM_TURNS[name], rng, vocab_size)
    return workload


def resend_history(messages: list[list[int]], answer_lens: list[int], num_turns: int, rng, vocab_size: int):
    """The requests as the turns of ``len(messages) / num_turns`` chats, interleaved: with ``c`` chats,
    request ``i`` is turn ``i // c`` of chat ``i % c``. Its prompt resends the chat's previous prompt
    and a stand-in for that turn's answer (random ids of the answer's length, as in
    ``minillm.workloads.multi_turn``: a cache finds the earlier prompt, not the answer), then its own
    message. A chat's turns are ``c`` requests apart: the think time shrinks with the rate, like every gap."""
    num_chats = -(-len(messages) // num_turns)  # rounded up
    prompts = []
    for i, message in enumerate(messages):
        if i < num_chats:
            prompts.append(message)
        else:
            answer = rng.integers(0, vocab_size, size=answer_lens[i - num_chats]).tolist()
            prompts.append(prompts[i - num_chats] + answer + message)
    return prompts


def at_rate(base: Workload, rate: float) -> Workload:
    """``base`` (arrivals at 1 request/s) with its arrival times divided by ``rate``."""
    return Workload(base.prompts, base.sampling_params, [t / rate for t in base.arrival_times])
