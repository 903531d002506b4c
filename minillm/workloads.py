"""Workloads: which prompts arrive, when, and how many tokens each wants.

A ``Workload`` is three parallel lists that ``LLM.generate`` takes as they are::

    w = workloads.random_workload(100, prompt_lens=uniform(16, 128), output_lens=uniform(8, 64), rate=20)
    outputs = llm.generate(w.prompts, w.sampling_params, w.arrival_times)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from minillm.sampling_params import SamplingParams

DEMO_PROMPTS = [
    "The KV cache stores",
    "Continuous batching lets a server",
    "Prefill is compute-bound, while decode",
    "A paged attention kernel reads keys and values from blocks that",
]

# A length distribution draws n integer lengths from a seeded numpy Generator.
LengthDist = Callable[[int, np.random.Generator], list[int]]


@dataclass
class Workload:
    prompts: list[list[int]]  # token ids
    sampling_params: list[SamplingParams]
    arrival_times: list[float]  # seconds from the start

    def __len__(self):
        return len(self.prompts)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def num_output_tokens(self) -> int:
        return sum(p.max_tokens for p in self.sampling_params)


def fixed(
    prompt_lens: list[int],
    output_lens: list[int],
    arrival_times: list[float] | None = None,
    vocab_size: int = 256,
    seed: int = 0,
) -> Workload:
    """Exactly these lengths, random token ids, EOS ignored so every request runs its full length."""
    if len(prompt_lens) != len(output_lens):
        raise ValueError(f"prompt_lens has {len(prompt_lens)} entries but output_lens has {len(output_lens)}")
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab_size, size=n).tolist() for n in prompt_lens]
    params = [SamplingParams(max_tokens=int(m), ignore_eos=True) for m in output_lens]
    times = list(arrival_times) if arrival_times is not None else [0.0] * len(prompts)
    return Workload(prompts, params, times)


def uniform(low: int, high: int) -> LengthDist:
    """Lengths uniform on the integers ``low..high`` (both included)."""
    return lambda n, rng: rng.integers(low, high + 1, size=n).tolist()


def lognormal(median: float, sigma: float, low: int = 1, high: int = 1 << 30) -> LengthDist:
    """Long-tailed lengths (a few very long requests), as real chat traffic has; clipped to [low, high]."""
    return lambda n, rng: (
        np.clip(np.round(rng.lognormal(np.log(median), sigma, size=n)), low, high).astype(int).tolist()
    )


def gamma_lengths(mean: float, cv: float, low: int = 1, high: int = 1 << 30) -> LengthDist:
    """Lengths with this mean and coefficient of variation (standard deviation / mean): ``cv=0`` gives
    every request ``mean`` tokens, larger ``cv`` spreads them (a gamma distribution, clipped to
    [low, high]), so one knob sweeps from uniform traffic to a few very long answers."""
    if mean <= 0 or cv < 0:
        raise ValueError(f"gamma_lengths needs mean > 0 and cv >= 0, got mean={mean}, cv={cv}")
    if cv == 0:
        return lambda n, rng: [int(round(mean))] * n
    shape = 1.0 / cv**2
    return lambda n, rng: np.clip(np.round(rng.gamma(shape, mean / shape, size=n)), low, high).astype(int).tolist()


def mixture(*parts: tuple[float, LengthDist]) -> LengthDist:
    """``mixture((0.8, short), (0.2, long))``: each request draws from one part, by weight."""
    weights = np.array([w for w, _ in parts], dtype=float)

    def draw(n, rng):
        which = rng.choice(len(parts), size=n, p=weights / weights.sum())
        samples = [parts[k][1](n, rng) for k in range(len(parts))]
        return [samples[k][i] for i, k in enumerate(which)]

    return draw


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """Arrival times of a Poisson process: exponential gaps with mean ``1 / rate`` seconds."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0 requests per second, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return np.cumsum(gaps).tolist()


def random_workload(
    num_requests: int,
    prompt_lens: LengthDist,
    output_lens: LengthDist,
    rate: float | None = None,
    vocab_size: int = 256,
    seed: int = 0,
) -> Workload:
    """Lengths from the two distributions; all at time 0, or Poisson arrivals at ``rate`` per second."""
    rng = np.random.default_rng(seed)
    p_lens, o_lens = prompt_lens(num_requests, rng), output_lens(num_requests, rng)
    times = poisson_arrivals(num_requests, rate, seed) if rate else None
    return fixed(p_lens, o_lens, times, vocab_size, seed)


def shared_prefix(
    num_requests: int,
    prefix_len: int,
    suffix_lens: LengthDist,
    output_lens: LengthDist,
    rate: float | None = None,
    vocab_size: int = 256,
    seed: int = 0,
) -> Workload:
    """Every request starts with the same ``prefix_len`` tokens (a system prompt, few-shot examples),
    then its own suffix: the traffic a prefix cache serves best. All at time 0, or Poisson arrivals."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, vocab_size, size=prefix_len).tolist()
    s_lens, o_lens = suffix_lens(num_requests, rng), output_lens(num_requests, rng)
    prompts = [prefix + rng.integers(0, vocab_size, size=n).tolist() for n in s_lens]
    params = [SamplingParams(max_tokens=int(m), ignore_eos=True) for m in o_lens]
    times = poisson_arrivals(num_requests, rate, seed) if rate else [0.0] * num_requests
    return Workload(prompts, params, times)


def multi_turn(
    num_conversations: int,
    num_turns: int,
    message_lens: LengthDist,
    output_lens: LengthDist,
    rate: float | None = None,
    think_time: float = 2.0,
    vocab_size: int = 256,
    seed: int = 0,
) -> Workload:
    """Chats that resend their history: turn k's prompt is turn k-1's prompt, a stand-in for its answer
    (random ids of the answer's length: the model's own answer is not known before it runs, so a
    cache can find the earlier prompt but not the earlier answer), then the user's next message.
    Conversations start all at 0 or as Poisson arrivals at ``rate``; each turn comes ``think_time``
    seconds after the one before. Requests are in arrival order."""
    rng = np.random.default_rng(seed)
    starts = poisson_arrivals(num_conversations, rate, seed) if rate else [0.0] * num_conversations
    turns = []  # (arrival time, prompt, answer length)
    for start in starts:
        history: list[int] = []
        messages, answers = message_lens(num_turns, rng), output_lens(num_turns, rng)
        for k in range(num_turns):
            prompt = history + rng.integers(0, vocab_size, size=messages[k]).tolist()
            turns.append((start + k * think_time, prompt, int(answers[k])))
            history = prompt + rng.integers(0, vocab_size, size=answers[k]).tolist()
    turns.sort(key=lambda t: t[0])
    return Workload(
        [p for _, p, _ in turns],
        [SamplingParams(max_tokens=m, ignore_eos=True) for _, _, m in turns],
        [t for t, _, _ in turns],
    )


def repeated_tokens(workload: Workload) -> int:
    """The prompt tokens of ``workload`` that an earlier request's prompt already began with: the
    most a prefix cache could skip, counted before anything runs (whole tokens, not blocks)."""
    root: dict = {}  # a tree of the earlier prompts: token -> the tree of what followed it
    repeated = 0
    for prompt in workload.prompts:
        node = root
        for token in prompt:
            if token not in node:
                break
            node = node[token]
            repeated += 1
        node = root
        for token in prompt:
            node = node.setdefault(token, {})
    return repeated


def two_slot_example() -> Workload:
    """The classic example for two slots: A needs 2 steps, B needs 4, C arrives with A and B and
    needs 2. Prompts are one token, so a step is one token per running request (the prefill step
    produces the first token). With ``max_num_seqs=2``, static batching starts C only after B
    finishes; iteration-level scheduling starts C as soon as A leaves."""
    return fixed(prompt_lens=[1, 1, 1], output_lens=[2, 4, 2], seed=0)


def anchor_benchmark(
    num_requests: int = 256, low: int = 100, high: int = 1024, vocab_size: int = 10001, seed: int = 0
) -> Workload:
    """The benchmark of ``minillm/benchmarks/anchors`` (nano-vllm's bench): prompt and output lengths uniform in
    [100, 1024], random token ids, EOS ignored. The draw order matches the anchor script, so seed 0
    gives the same 142,827 prompt and 133,966 output tokens."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, vocab_size - 1) for _ in range(rng.randint(low, high))] for _ in range(num_requests)]
    outputs = [rng.randint(low, high) for _ in range(num_requests)]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in outputs]
    return Workload(prompts, params, [0.0] * num_requests)


# Named length mixes for the widgets' dropdown. Each request draws one kind by weight, then its
# prompt and output lengths from that kind, so long prompts come with long answers where they do.
LENGTH_MIXES: dict[str, list[tuple[float, LengthDist, LengthDist]]] = {
    "support chat: short answers + long summaries": [
        (0.8, uniform(16, 64), uniform(4, 24)),  # a question, a short answer
        (0.2, uniform(200, 400), uniform(64, 128)),  # a long thread to summarise
    ],
    "uniform": [(1.0, uniform(16, 256), uniform(8, 128))],
    "long tail: a few very long answers": [(1.0, lognormal(64, 0.6, 8, 512), lognormal(16, 1.0, 2, 256))],
    # GPU scale (the simulated H200): a document's whole prefill stalls every decode of its step
    "chat + long documents (GPU scale)": [
        (0.8, uniform(32, 256), uniform(64, 256)),  # chat turns that keep decoding
        (0.2, uniform(1024, 4096), uniform(16, 64)),  # a document to summarise
    ],
}


def mix_workload(
    mix: str, num_requests: int, rate: float | None = None, vocab_size: int = 256, seed: int = 0
) -> Workload:
    """A workload from one of ``LENGTH_MIXES``: all at time 0, or Poisson arrivals at ``rate``."""
    if mix not in LENGTH_MIXES:
        raise ValueError(f"unknown mix {mix!r}; choose one of {', '.join(map(repr, LENGTH_MIXES))}")
    p_lens, o_lens = draw_lengths(LENGTH_MIXES[mix], num_requests, np.random.default_rng(seed))
    times = poisson_arrivals(num_requests, rate, seed) if rate else None
    return fixed(p_lens, o_lens, times, vocab_size, seed)


def draw_lengths(kinds, num_requests: int, rng) -> tuple[list[int], list[int]]:
    """Prompt and output lengths of ``num_requests`` requests of a mix: ``kinds`` is a list of
    ``(weight, prompt length distribution, output length distribution)``; each request picks a kind
    by weight, then draws its lengths from that kind's distributions."""
    weights = np.array([w for w, _, _ in kinds], dtype=float)
    which = rng.choice(len(kinds), size=num_requests, p=weights / weights.sum())
    drawn = [(prompt(num_requests, rng), output(num_requests, rng)) for _, prompt, output in kinds]
    return [drawn[k][0][i] for i, k in enumerate(which)], [drawn[k][1][i] for i, k in enumerate(which)]
