"""Grading tests for chapter 1 (``decode_loop`` and ``latency_metrics``).

They run against ``solutions/`` under plain pytest and against ``exercises/`` under
``minillm grade``; ``load_impl`` picks the module from ``MINILLM_IMPL``. The engine's own greedy
output is the oracle: the learner's loop must produce exactly the tokens ``LLM.generate`` does.
"""

import math

import pytest

from minillm import LLM, SamplingParams
from minillm.course import load_impl
from minillm.metrics import RequestMetrics

PROMPTS = ["0123456789", "minillm", "def f(x):\n    return", "!!!"]  # the first one meets EOS early


@pytest.fixture(scope="module")
def ch01():
    return load_impl("ch01_naive")


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", dtype="float32")


def count_forward_tokens(llm, monkeypatch) -> list[int]:
    """Make ``llm.model`` record how many tokens each forward pass gets; returns the record."""
    calls, forward = [], llm.model.forward

    def counting_forward(input_ids, positions, kv_cache=None):
        calls.append(input_ids.numel())
        return forward(input_ids, positions, kv_cache)

    monkeypatch.setattr(llm.model, "forward", counting_forward)
    return calls


@pytest.mark.hint("Positions run 0..n-1 for the prompt, then n, n+1, ...; pick argmax of the logits of the last row.")
def test_decode_loop_matches_engine(ch01, llm):
    for prompt in PROMPTS:
        ids = llm.encode(prompt)
        expected = llm.generate(prompt, SamplingParams(max_tokens=16, ignore_eos=False))[0].token_ids
        got = ch01.decode_loop(llm.model, ids, 16, llm.eos_token_id)
        assert isinstance(got, list) and all(type(t) is int for t in got), f"return a list of Python ints, got {got!r}"
        assert got == expected, f"prompt {prompt!r}: expected {expected}, got {got}"


@pytest.mark.hint("Stop once you have max_tokens tokens, and never return more.")
def test_decode_loop_respects_max_tokens(ch01, llm):
    ids = llm.encode("minillm")
    for max_tokens in (1, 2, 7):
        got = ch01.decode_loop(llm.model, ids, max_tokens, eos_token_id=None)
        assert len(got) == max_tokens, f"max_tokens={max_tokens}: got {len(got)} tokens"


@pytest.mark.hint("Stop right after generating eos_token_id, and keep that token in the output.")
def test_decode_loop_stops_at_eos(ch01, llm):
    prompt = "def f(x):\n    return"
    tokens = llm.generate(prompt, SamplingParams(max_tokens=16, ignore_eos=True))[0].token_ids
    k = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])  # a token greedy first makes at step k
    got = ch01.decode_loop(llm.model, llm.encode(prompt), 16, eos_token_id=tokens[k])
    assert got == tokens[: k + 1], f"with eos_token_id={tokens[k]}: expected {tokens[: k + 1]}, got {got}"


@pytest.mark.hint("Prefill: pass the whole prompt to the model in one forward pass, not one token at a time.")
def test_decode_loop_prefills_in_one_forward(ch01, llm, monkeypatch):
    ids = llm.encode("def f(x):\n    return")
    calls = count_forward_tokens(llm, monkeypatch)
    ch01.decode_loop(llm.model, ids, 4, eos_token_id=None)
    assert calls and calls[0] == len(ids), f"the first forward pass got {calls[:1]} tokens; the prompt has {len(ids)}"


@pytest.mark.hint("Use the KV cache: after the prefill, each forward pass gets only the newest token.")
def test_decode_loop_uses_kv_cache(ch01, llm, monkeypatch):
    ids, max_tokens = llm.encode("minillm"), 8
    calls = count_forward_tokens(llm, monkeypatch)
    ch01.decode_loop(llm.model, ids, max_tokens, eos_token_id=None)
    expected = len(ids) + max_tokens - 1  # the last token generated is never fed back
    assert sum(calls) == expected, f"the model processed {sum(calls)} tokens in {len(calls)} passes; with a KV cache it needs {expected}"


def reference_metrics(arrival_time: float, token_times: list[float]) -> RequestMetrics:
    return RequestMetrics(arrival_time, first_token_time=token_times[0], token_times=token_times, finished_time=token_times[-1])


def assert_matches(got, m: RequestMetrics, label: str):
    """``got`` must hold ``RequestMetrics``' ttft, itl and e2e."""
    assert isinstance(got, dict) and {"ttft", "itl", "e2e"} <= set(got), f"return a dict with ttft, itl and e2e, got {got!r}"
    for key, expected in (("ttft", m.ttft), ("e2e", m.e2e)):
        assert math.isclose(got[key], expected, abs_tol=1e-12), f"{label}: {key} should be {expected}, got {got[key]}"
    itl = list(got["itl"])
    assert len(itl) == len(m.itl) and all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(itl, m.itl)), (
        f"{label}: itl should be {m.itl}, got {itl}")


@pytest.mark.hint("ttft = first token - arrival; itl = gaps between neighbouring tokens; e2e = last token - arrival.")
def test_latency_metrics_hand_made(ch01):
    for arrival, times in ((1.0, [1.5, 1.75, 2.25, 2.5]), (0.0, [0.2, 0.3])):
        assert_matches(ch01.latency_metrics(arrival, times), reference_metrics(arrival, times), f"arrival {arrival}, tokens at {times}")


@pytest.mark.hint("With one token there are no gaps: itl is [] and e2e equals ttft.")
def test_latency_metrics_one_token(ch01):
    got = ch01.latency_metrics(0.5, [2.0])
    assert_matches(got, reference_metrics(0.5, [2.0]), "one token at 2.0, arrival 0.5")
    assert got["itl"] == [], f"itl for one token must be [], got {got['itl']}"


@pytest.mark.hint("Measure from the arrival time, not from the first token or from zero.")
def test_latency_metrics_match_engine(ch01, llm):
    outputs = llm.generate(["minillm", "!!!"], SamplingParams(max_tokens=5, ignore_eos=True), arrival_times=[0.0, 0.01])
    for o in outputs:
        m = o.metrics
        assert_matches(ch01.latency_metrics(m.arrival_time, list(m.token_times)), m, f"request {o.request_id}")
