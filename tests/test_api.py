"""The public API: LLM / SamplingParams / RequestOutput, streaming, trace, and bad input."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import LLM, RequestOutput, SamplingParams
from minillm.metrics import RequestMetrics, percentiles, request_table, summarize, summary_table


@pytest.fixture(scope="module")
def llm(tiny):
    return tiny


def test_generate_returns_outputs_in_prompt_order(llm):
    prompts = ["short", "a somewhat longer prompt than the first one"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True))
    assert [o.request_id for o in outs] == ["0", "1"]
    for prompt, o in zip(prompts, outs):
        assert isinstance(o, RequestOutput)
        assert o.prompt_token_ids == llm.tokenizer.encode(prompt)
        assert len(o.token_ids) == 5 and o.finish_reason == "length"
        assert o.text == llm.tokenizer.decode(o.token_ids)


def test_greedy_is_deterministic_and_matches_token_id_prompts(llm):
    ids = llm.tokenizer.encode("determinism")
    a = llm.generate("determinism", SamplingParams(max_tokens=8, ignore_eos=True))[0]
    b = llm.generate([ids], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    c = llm.generate(ids, SamplingParams(max_tokens=8, ignore_eos=True))[0]  # one prompt as a flat id list
    assert a.token_ids == b.token_ids == c.token_ids


def test_metrics_are_consistent(llm):
    outs = llm.generate(["one", "two", "three"], SamplingParams(max_tokens=4, ignore_eos=True))
    for o in outs:
        m = o.metrics
        assert len(m.token_times) == 4
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
        assert m.token_times == sorted(m.token_times)
        assert m.ttft == pytest.approx(m.first_token_time - m.arrival_time)
        assert m.e2e == pytest.approx(m.finished_time - m.arrival_time)
        assert len(m.itl) == 3 and all(g >= 0 for g in m.itl)
        assert m.finished_step - m.first_token_step == 3  # one token per step once decoding
    # Naive serves one request at a time: the second waits for the whole first request.
    assert outs[1].metrics.first_scheduled_time >= outs[0].metrics.finished_time
    assert outs[1].metrics.queue_time > 0


def test_trace_has_one_row_per_step(llm):
    outs = llm.generate(["ab", "cde"], SamplingParams(max_tokens=3, ignore_eos=True))
    trace = llm.trace
    assert len(trace) == 6  # naive: per request one prefill step and two decode steps
    assert trace[0].prefill_ids == ["0"] and trace[0].num_scheduled_tokens == {"0": len(outs[0].prompt_token_ids)}
    assert trace[1].decode_ids == ["0"] and trace[1].num_batched_tokens == 1
    assert trace[2].finished_ids == ["0"]
    assert trace[3].admitted_ids == ["1"]
    assert [s.step for s in trace] == list(range(6))
    assert all(s.num_running <= 1 for s in trace)


def test_stop_on_eos_and_stop_token_ids(llm):
    free = llm.generate("stop here", SamplingParams(max_tokens=6, ignore_eos=True))[0].token_ids
    stop_at = free[2]
    first = free.index(stop_at)
    out = llm.generate("stop here", SamplingParams(max_tokens=6, ignore_eos=True, stop_token_ids=[stop_at]))[0]
    assert out.finish_reason == "stop" and out.token_ids == free[: first + 1]
    llm_eos = LLM("tiny")
    llm_eos.eos_token_id = stop_at  # pretend the model's EOS is that token
    out = llm_eos.generate("stop here", SamplingParams(max_tokens=6))[0]
    assert out.finish_reason == "stop" and out.token_ids == free[: first + 1]


def test_sampling_is_seeded_and_per_request(llm):
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    a = llm.generate("x", p)[0].token_ids
    b = llm.generate(["other prompt", "x"], [SamplingParams(max_tokens=3), p])[1].token_ids
    assert a == b  # a request's samples do not depend on its neighbours
    c = llm.generate("x", SamplingParams(max_tokens=12, temperature=1.0, seed=8))[0].token_ids
    assert a != c


def test_top_k_one_is_greedy(llm):
    greedy = llm.generate("topk", SamplingParams(max_tokens=8))[0].token_ids
    top1 = llm.generate("topk", SamplingParams(max_tokens=8, temperature=1.5, top_k=1, seed=3))[0].token_ids
    assert greedy == top1


def test_top_k_and_top_p_filters():
    from minillm.models.sampler import apply_top_k_top_p

    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = lambda x: torch.isfinite(x).nonzero().flatten().tolist()  # noqa: E731
    assert kept(apply_top_k_top_p(logits, 2, 1.0)) == [0, 1]
    assert kept(apply_top_k_top_p(logits, 0, 0.5)) == [0]
    assert kept(apply_top_k_top_p(logits, 0, 0.8)) == [0, 1]
    assert kept(apply_top_k_top_p(logits, 0, 0.81)) == [0, 1, 2]
    shuffled = logits[[2, 0, 3, 1]]
    assert kept(apply_top_k_top_p(shuffled, 0, 0.8)) == [1, 3]


def test_sampling_follows_the_distribution():
    from minillm.models.sampler import sample

    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(4000, 3).clone()
    g = torch.Generator().manual_seed(0)
    params = [SamplingParams(temperature=1.0)] * 4000
    tokens = sample(logits, params, [g] * 4000)
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.7, 1.0, 1.5]),  # temperature (0: greedy)
            st.sampled_from([0, 1, 5, 50]),  # top_k (0: off)
            st.sampled_from([1.0, 0.9, 1e-6]),  # top_p
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 1000),
)
def test_a_batch_samples_what_each_request_samples_alone(choices, seed):
    """Greedy and sampling rows with their own temperature, top-k and top-p, drawn together, give each
    request the token it draws alone from a generator in the same state."""
    from minillm.models.sampler import sample

    logits = torch.randn(len(choices), 300, generator=torch.Generator().manual_seed(seed))
    params = [SamplingParams(temperature=t, top_k=k, top_p=p) for t, k, p in choices]

    def generators():
        return [torch.Generator().manual_seed(seed + i) for i in range(len(params))]

    alone = [sample(logits[i : i + 1], [p], [g]).item() for i, (p, g) in enumerate(zip(params, generators()))]
    assert sample(logits, params, generators()).tolist() == alone


def test_a_sampling_request_adds_a_few_operations_not_a_loop_of_them():
    """On a GPU each operation is a launch: a request beyond the first adds its random draw (and the
    row it draws into), while the scaling, filtering and the draw's argmax run once for all."""
    from minillm.models.sampler import sample

    def num_ops(n):
        logits = torch.randn(n, 1000)
        params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50)] * n
        generators = [torch.Generator().manual_seed(i) for i in range(n)]
        with torch.profiler.profile() as prof:
            sample(logits, params, generators)
        return sum(1 for e in prof.events() if e.name.startswith("aten::"))

    per_request = (num_ops(65) - num_ops(1)) / 64
    assert per_request <= 4, f"{per_request:.1f} operations for each request beyond the first"


def test_streaming_yields_every_token_in_order(llm):
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    events = list(llm.stream(["stream me", "and me"], params))
    outs = llm.last_outputs
    for o in outs:
        mine = [e for e in events if e.request_id == o.request_id]
        assert [e.token_id for e in mine] == o.token_ids
        assert [e.index for e in mine] == list(range(5))
        assert [e.finished for e in mine] == [False] * 4 + [True]
        assert "".join(e.text for e in mine) == o.text
        assert [e.time for e in mine] == o.metrics.token_times


def test_timed_arrivals_are_respected(llm):
    outs = llm.generate(["early", "late"], SamplingParams(max_tokens=2), arrival_times=[0.0, 0.3])
    late = outs[1].metrics
    assert late.arrival_time == 0.3
    assert late.first_scheduled_time >= 0.3
    assert late.queue_time >= 0 and late.ttft >= 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.2}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda llm: llm.generate(""), "prompt 0 is empty"),
        (lambda llm: llm.generate([]), "empty"),
        (lambda llm: llm.generate([[]]), "prompt 0 is empty"),
        (lambda llm: llm.generate([[1, 2, 999]]), r"token id 999 outside the vocabulary \[0, 259\)"),
        (lambda llm: llm.generate([[-1]]), "outside the vocabulary"),
        (lambda llm: llm.generate([[1] * 2049]), "2049 tokens, more than max_model_len=2048"),
        (
            lambda llm: llm.generate([[1] * 2000], SamplingParams(max_tokens=100)),
            "max_tokens=100 exceeds max_model_len=2048",
        ),
        (lambda llm: llm.generate(["a", "b"], [SamplingParams()] * 3), "sampling_params has 3 entries for 2 prompts"),
        (lambda llm: llm.generate(["a", "b"], arrival_times=[0.0]), "arrival_times has 1 entries for 2 prompts"),
        (lambda llm: llm.generate(["a"], arrival_times=[-1.0]), r"arrival_times\[0\]"),
        (lambda llm: llm.generate(["a"], arrival_times=[math.nan]), r"arrival_times\[0\]"),
    ],
)
def test_bad_requests_raise_and_leave_no_state(llm, call, match):
    with pytest.raises(ValueError, match=match):
        call(llm)
    out = llm.generate("still works", SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out) == 1 and len(out[0].token_ids) == 3


def test_bad_request_among_good_ones_runs_nothing(llm):
    llm.generate("warm", SamplingParams(max_tokens=1))
    before = llm.trace
    with pytest.raises(ValueError, match="prompt 1"):
        llm.generate(["fine", ""], SamplingParams(max_tokens=2))
    assert llm.trace is before  # no engine ran


def test_unknown_and_unbuilt_engines(monkeypatch):
    from minillm import engines

    with pytest.raises(ValueError) as error:
        LLM("tiny", engine="fast")
    assert (
        str(error.value)
        == "unknown engine 'fast'; available: naive, static, continuous, selective, paged, chunked, sglang, trtllm, tgi"
    )
    # Every chapter's engine is built now; one a later chapter named would be listed, and refused.
    monkeypatch.setitem(engines.ENGINE_CHAPTERS, "future", 9)
    with pytest.raises(ValueError) as error:
        LLM("tiny", engine="fast")
    assert str(error.value).endswith(
        "available: naive, static, continuous, selective, paged, chunked, sglang, trtllm, tgi (future: chapter 9)"
    )
    with pytest.raises(NotImplementedError, match="future.*chapter 9"):
        LLM("tiny", engine="future")
    with pytest.raises(ValueError, match="takes no engine options"):
        LLM("tiny", engine="naive", max_num_seqs=4)


def test_bad_model_arguments():
    with pytest.raises(ValueError, match="max_model_len"):
        LLM("tiny", max_model_len=4096)
    with pytest.raises(ValueError, match="dtype"):
        LLM("tiny", dtype="float8")
    with pytest.raises(ValueError, match="model must be"):
        LLM(42)


def test_max_model_len_limits_requests():
    llm = LLM("tiny", max_model_len=32)
    with pytest.raises(ValueError, match="max_model_len=32"):
        llm.generate([[1] * 30], SamplingParams(max_tokens=3))
    assert len(llm.generate([[1] * 29], SamplingParams(max_tokens=3, ignore_eos=True))[0].token_ids) == 3


def test_float64_runs(llm):
    llm64 = LLM("tiny", dtype="float64")
    a = llm64.generate("precise", SamplingParams(max_tokens=6, ignore_eos=True))[0].token_ids
    b = llm.generate("precise", SamplingParams(max_tokens=6, ignore_eos=True))[0].token_ids
    assert a == b  # same weights; random logits are far from ties


def test_metrics_math_and_tables(llm):
    m = RequestMetrics(
        arrival_time=1.0,
        first_scheduled_time=1.5,
        first_token_time=2.0,
        token_times=[2.0, 2.25, 2.75],
        finished_time=2.75,
    )
    assert (m.queue_time, m.ttft, m.e2e) == (0.5, 1.0, 1.75)
    assert m.itl == [0.25, 0.5]
    assert percentiles([1, 2, 3, 4])["p50"] == 2.5
    assert all(math.isnan(v) for v in percentiles([]).values())
    outs = llm.generate(["x", "y"], SamplingParams(max_tokens=3, ignore_eos=True))
    s = summarize(outs, llm.trace)
    assert s["generation_tokens"] == 6 and s["num_requests"] == 2
    assert s["time_to_first_token_seconds"]["p50"] > 0
    assert s["num_requests_running"]["max"] == 1
    assert s["num_requests_waiting"]["max"] == 1
    assert "TTFT" in summary_table(s)
    table = request_table(outs)
    assert len(table.splitlines()) == 4 and "length" in table


def test_cli_demo_prints_a_table_and_reports_bad_input_without_a_traceback(capsys):
    from minillm.cli import main

    assert main(["demo", "--max-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "TTFT ms" in out and "mean ITL ms" in out and "output tok/s" in out
    assert "'The KV cache stores' -> " in out  # what the model wrote, prompt by prompt
    assert main(["demo", "--engine", "fast"]) == 2
    err = capsys.readouterr().err
    assert "unknown engine 'fast'" in err and "Traceback" not in err


def test_default_dtype_follows_the_device(monkeypatch):
    """float32 on a CPU; on a GPU bfloat16 where it computes in it, else float16 (a T4 is 7.5)."""
    from minillm.llm import resolve_dtype

    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    for capability, expected in (((9, 0), torch.bfloat16), ((8, 0), torch.bfloat16), ((7, 5), torch.float16)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert resolve_dtype(None, torch.device("cuda")) == expected
    assert resolve_dtype("bfloat16", torch.device("cuda")) == torch.bfloat16  # asked for: kept
