"""Grading tests for chapter 1 (``decode_loop`` and ``latency_metrics``).

The learner's functions run in a child process (``minillm.course.sandbox``): the ``run_*`` probes
below call them there and return plain data, and every check happens here. The engine's own greedy
output is the oracle: the learner's loop must produce exactly the tokens ``LLM.generate`` does.
Each ``decode_loop`` test looks at one part of the contract (tokens, passes, cache, positions, EOS,
max_tokens, dtype), so its hint can name the mistake it caught.
"""

import math
from functools import cache

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.course.sandbox import LearnerProcess, type_name
from minillm.metrics import RequestMetrics

PROMPTS = [
    "0123456789",
    "minillm",
    "def f(x):\n    return",
    "!!!",
    "a",
]  # the first meets EOS early; the last is one token


# The last rung of each test's hint ladder (check(..., hint=N)): the idea, never the code. A test
# gets the idea of the longest key in its name, else the "*" one.
IDEAS = {
    "decode_loop": (
        "The idea: one forward pass over the whole prompt fills the cache and gives the first token; after "
        "that each pass reads only the newest token, at the next position, and the cache holds everything "
        "before it."
    ),
    "latency_metrics": (
        "The idea: every latency is a difference of two timestamps: the first and the last token against the "
        "arrival, and each token against the one before it."
    ),
}


@pytest.fixture(scope="module")
def ch01():
    with LearnerProcess("ch01_naive") as learner:
        yield learner


@cache
def tiny(dtype: str = "float32") -> LLM:
    """The tiny model, once per process (the grader's and the learner's each load their own)."""
    return LLM("tiny", dtype=dtype, device="cpu")


# --- probes: these run in the learner's process ------------------------------------------------
class RecordingModel:
    """The tiny model as ``decode_loop`` sees it, recording what each forward pass gets.

    ``shift`` renumbers the vocabulary (id i here is id ``(i + shift) % vocab`` in the model), so a
    test can make any token the model generates come out as id 0."""

    def __init__(self, model, shift: int = 0):
        self.model, self.shift, self.passes = model, shift, []

    def __call__(self, input_ids, positions, kv_cache=None):
        self.passes.append(
            {
                "num_tokens": torch.as_tensor(input_ids).numel(),
                "positions": torch.as_tensor(positions).flatten().tolist(),
                "cache_tokens": getattr(kv_cache, "num_tokens", None),  # how many tokens the cache says it holds
                "cache_dtype": str(getattr(kv_cache, "k", torch.empty(0)).dtype) if kv_cache is not None else None,
                "cache_id": id(kv_cache),
            }
        )
        return self.model((input_ids + self.shift) % self.model.config.vocab_size, positions, kv_cache)

    forward = __call__

    def compute_logits(self, hidden):
        return self.model.compute_logits(hidden).roll(-self.shift, dims=-1)

    def __getattr__(self, name):  # config, parameters(), ...: the model's own
        return getattr(self.model, name)


def run_decode_loop(ch01, prompt_ids, max_tokens, eos_token_id, dtype="float32", shift=0):
    model = RecordingModel(tiny(dtype).model, shift)
    return {"tokens": ch01.decode_loop(model, prompt_ids, max_tokens, eos_token_id), "passes": model.passes}


def run_latency_metrics(ch01, arrival_time, token_times):
    return ch01.latency_metrics(arrival_time, token_times)


# --- checks: these run here --------------------------------------------------------------------
@cache
def engine_tokens(prompt: str, max_tokens: int = 16, ignore_eos: bool = True, dtype: str = "float32") -> list[int]:
    return tiny(dtype).generate(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))[0].token_ids


def as_token_list(tokens) -> list[int]:
    """The learner's tokens as a list of ints, for comparing; ``test_decode_loop_returns_python_ints``
    checks the type itself."""
    if isinstance(tokens, torch.Tensor):
        return tokens.flatten().tolist()
    assert isinstance(tokens, (list, tuple)), f"return a list of token ids, got {type_name(tokens)}"
    return [int(t) if isinstance(t, (int, torch.Tensor)) else t for t in tokens]


def decode(ch01, prompt, max_tokens=16, eos_token_id=None, dtype="float32"):
    got = ch01.call(run_decode_loop, tiny().encode(prompt), max_tokens, eos_token_id, dtype)
    return as_token_list(got["tokens"]), got["passes"]


@pytest.mark.points(2)
@pytest.mark.hint(
    "Greedy decoding: argmax of the logits of the LAST row of hidden, fed back as the next token; "
    "follow the docstring's steps 1-5."
)
def test_decode_loop_matches_engine(ch01):
    llm = tiny()
    for prompt in PROMPTS:
        expected = engine_tokens(prompt, ignore_eos=False)
        got, _ = decode(ch01, prompt, 16, llm.eos_token_id)
        assert got == expected, f"prompt {prompt!r}: expected {expected}, got {got}"


@pytest.mark.hint("Return a list of Python ints: int(token) for each one (or tensor.tolist()), not tensors.")
def test_decode_loop_returns_python_ints(ch01):
    got = ch01.call(run_decode_loop, tiny().encode("minillm"), 3, None)["tokens"]
    assert type(got) is list and all(type(t) is int for t in got), (
        f"return a list of Python ints, got a {type_name(got)}"
        + (f" of {type_name(got[0])}" if isinstance(got, list) and got else "")
    )


@pytest.mark.hint(
    "Prefill: pass the whole prompt in ONE forward pass; after it, each pass gets only the newest token "
    "(the cache holds the rest), and the last token is never fed back."
)
def test_decode_loop_prefills_then_one_token_per_pass(ch01):
    for prompt, max_tokens in (("def f(x):\n    return", 6), ("a", 3), ("minillm", 1)):
        n = len(tiny().encode(prompt))
        tokens, passes = decode(ch01, prompt, max_tokens)
        got = [p["num_tokens"] for p in passes]
        expected = [n] + [1] * (
            len(tokens) - 1
        )  # for as many tokens as you made (test_decode_loop_respects_max_tokens counts them)
        assert got == expected, (
            f"prompt of {n} tokens, {len(tokens)} tokens made: tokens per forward pass {got}, expected {expected}"
        )


@pytest.mark.hint(
    "After every forward pass call cache.advance(number of tokens that pass ran), and use one cache "
    "for the whole loop: otherwise the next pass overwrites what the cache holds."
)
def test_decode_loop_advances_the_cache(ch01):
    prompt = "minillm"
    n = len(tiny().encode(prompt))
    _, passes = decode(ch01, prompt, 5)
    assert all(p["cache_tokens"] is not None for p in passes), (
        "pass your ContiguousKVCache to every forward pass: model(ids, positions, cache)"
    )
    assert len({p["cache_id"] for p in passes}) == 1, "make ONE cache before the prefill and use it for every pass"
    got = [p["cache_tokens"] for p in passes]
    expected = [0] + list(range(n, n + len(passes) - 1))
    assert got == expected, f"tokens the cache held at the start of each pass: {got}, expected {expected}"


@pytest.mark.hint(
    "positions are each token's index in the whole sequence: 0..n-1 for the prompt, then n, n+1, ... "
    "(from cache.num_tokens, that is only right if you advance the cache after every pass)."
)
def test_decode_loop_positions(ch01):
    for prompt, max_tokens in (("def f(x):\n    return", 5), ("a", 3)):
        n = len(tiny().encode(prompt))
        _, passes = decode(ch01, prompt, max_tokens)
        got = [p["positions"] for p in passes]
        expected = [list(range(n))] + [[n + i] for i in range(len(passes) - 1)]
        assert got == expected, f"prompt of {n} tokens: positions of each pass {got}, expected {expected}"


@pytest.mark.hint("Stop as soon as you have max_tokens tokens (max_tokens=1: the prefill's token only), never more.")
def test_decode_loop_respects_max_tokens(ch01):
    for max_tokens in (1, 2, 7):
        got, _ = decode(ch01, "minillm", max_tokens)
        assert len(got) == max_tokens, f"max_tokens={max_tokens} and no EOS: got {len(got)} tokens {got}"


def first_new_token_step(tokens: list[int], start: int) -> int:
    """The first step >= ``start`` whose token the loop has not made before: EOS there stops the loop there."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


# The EOS tests take the learner's own tokens without EOS as the reference, so that they fail only
# for a mistake in stopping, whatever else is wrong.
@pytest.mark.hint(
    "Check every generated token, the prefill's first one too: stop right after eos_token_id and keep it in the output."
)
def test_decode_loop_stops_at_eos(ch01):
    prompt = "def f(x):\n    return"
    tokens, _ = decode(ch01, prompt, 16)
    for k in (0, first_new_token_step(tokens, 2)):
        got, _ = decode(ch01, prompt, 16, eos_token_id=tokens[k])
        assert got == tokens[: k + 1], (
            f"without EOS your loop makes {tokens}; with eos_token_id={tokens[k]} it should "
            f"stop after step {k}: expected {tokens[: k + 1]}, got {got}"
        )


@pytest.mark.hint(
    "eos_token_id may be 0, a real token id: compare token == eos_token_id (None means no EOS), "
    "not `if eos_token_id and ...`."
)
def test_decode_loop_eos_token_id_zero(ch01):
    prompt = "def f(x):\n    return"
    tokens, _ = decode(ch01, prompt, 16)
    k, vocab = first_new_token_step(tokens, 1), tiny().model.config.vocab_size
    shift = tokens[k]  # renumber the vocabulary so that this token is id 0
    prompt_ids = [(t - shift) % vocab for t in tiny().encode(prompt)]
    got = as_token_list(ch01.call(run_decode_loop, prompt_ids, 16, 0, "float32", shift)["tokens"])
    expected = [(t - shift) % vocab for t in tokens[: k + 1]]
    # Whether the EOS token stays in the output is test_decode_loop_stops_at_eos's business.
    assert got in (expected, expected[:-1]), (
        f"with eos_token_id=0 (your loop makes token 0 at step {k}): expected {expected}, got {got}"
    )


@pytest.mark.hint(
    "Make the cache with the model's dtype and device: next(model.parameters()).dtype and .device, "
    "not float32 or the CPU."
)
def test_decode_loop_in_other_dtypes(ch01):
    right_in_float32 = decode(ch01, "minillm", 8)[0] == engine_tokens("minillm", 8)
    for dtype in ("bfloat16", "float64"):
        got, passes = decode(ch01, "minillm", 8, dtype=dtype)
        cache_dtypes = {p["cache_dtype"] for p in passes}
        assert cache_dtypes == {f"torch.{dtype}"}, f"a {dtype} model: your cache holds {sorted(map(str, cache_dtypes))}"
        if right_in_float32:  # else test_decode_loop_matches_engine names the mistake
            expected = engine_tokens("minillm", 8, dtype=dtype)
            assert got == expected, f"a {dtype} model: expected {expected}, got {got}"


# --- latency_metrics ----------------------------------------------------------------------------
def as_number(value, what: str) -> float:
    assert isinstance(value, (int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1), (
        f"{what} must be a number, got {type_name(value)}"
    )
    return float(value)


def assert_matches(got, m: RequestMetrics, label: str):
    """``got`` must hold ``RequestMetrics``' ttft, itl and e2e (itl as any sequence of numbers)."""
    assert isinstance(got, dict) and {"ttft", "itl", "e2e"} <= set(got), (
        f"return a dict with ttft, itl and e2e, got {got!r}"
    )
    for key, expected in (("ttft", m.ttft), ("e2e", m.e2e)):
        value = as_number(got[key], key)
        assert math.isclose(value, expected, abs_tol=1e-12), f"{label}: {key} should be {expected}, got {value}"
    itl = got["itl"]
    assert isinstance(itl, (list, tuple, torch.Tensor)), f"itl must be a list of numbers, got {type_name(itl)}"
    itl = [as_number(x, "each itl gap") for x in (itl.flatten() if isinstance(itl, torch.Tensor) else itl)]
    assert len(itl) == len(m.itl), (
        f"{label}: itl should have {len(m.itl)} gaps (one per pair of neighbouring tokens), got {itl}"
    )
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(itl, m.itl)), (
        f"{label}: itl should be {m.itl}, got {itl}"
    )


def reference_metrics(arrival_time: float, token_times: list[float]) -> RequestMetrics:
    return RequestMetrics(
        arrival_time, first_token_time=token_times[0], token_times=token_times, finished_time=token_times[-1]
    )


def check_latency(ch01, arrival, times):
    got = ch01.call(run_latency_metrics, arrival, list(times))
    assert_matches(got, reference_metrics(arrival, list(times)), f"arrival {arrival}, tokens at {times}")


@pytest.mark.hint(
    "ttft = first token - arrival; e2e = last token - arrival; itl = the gaps between neighbouring tokens."
)
def test_latency_metrics_hand_made(ch01):
    for arrival, times in ((1.0, [1.5, 1.75, 2.25, 2.5]), (0.0, [0.2, 0.3]), (3.0, [3.5, 4.0, 4.0, 6.0])):
        check_latency(ch01, arrival, times)


@pytest.mark.hint("With one token there are no gaps: itl is empty and e2e equals ttft.")
def test_latency_metrics_one_token(ch01):
    check_latency(ch01, 0.5, [2.0])


@pytest.mark.hint(
    "Measure ttft and e2e from the arrival time, not from the first token or from zero; itl has no gap before the "
    "first token."
)
def test_latency_metrics_match_engine(ch01):
    outputs = tiny().generate(
        ["minillm", "!!!"], SamplingParams(max_tokens=5, ignore_eos=True), arrival_times=[0.0, 0.01]
    )
    for o in outputs:
        m = o.metrics
        assert_matches(
            ch01.call(run_latency_metrics, m.arrival_time, list(m.token_times)), m, f"request {o.request_id}"
        )
