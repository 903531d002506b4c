"""Chapter 9's fast path (``fast_path=`` on the paged and chunked engines): fused projections,
prepacked oneDNN matmuls, the C kernels and the compiled ops give the readable model's logits and the
eager engine's greedy tokens, on every model family, with chunks and preemption; bad values are
refused by name."""

from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.engines import build_engine
from minillm.kernels import cpu_build
from minillm.models import fast_model
from minillm.models.fast_model import FAST_PATH_STEPS, GEMV_MAX_ROWS, FastCausalLM, fast_path_steps, gemv_max_rows
from tests.hf_models import make_hf_model

FAMILIES = ("llama", "llama-biases", "qwen2", "qwen3", "smollm2")
# what fast_path=True takes on a CPU with a C compiler: every step but "compiled"
CPU_STEPS = ("fused", "prepacked", "cpu_attention", "cpu_ops", "cpu_gemv")
STEP_CHOICES = (True, ["fused"], ["prepacked"], ["cpu_attention"], ["cpu_ops"], ["cpu_gemv"], ["fused", "compiled"])
MODEL_STEP_CHOICES = (
    ["fused", "prepacked", "cpu_ops", "cpu_gemv"],
    ["fused"],
    ["prepacked"],
    ["cpu_ops"],
    ["fused", "cpu_ops"],
    ["cpu_gemv"],
    ["fused", "prepacked", "cpu_gemv"],
    ["fused", "compiled"],
)
PROMPTS = [[5, 9, 2, 7, 1, 3], [4, 4, 8], list(range(10, 40)), [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]


@pytest.fixture(scope="module", params=FAMILIES)
def family_llm(request) -> LLM:
    return LLM(make_hf_model(request.param), dtype="float32", device="cpu", num_threads=1)


@pytest.mark.parametrize("steps", MODEL_STEP_CHOICES, ids=str)
def test_fast_model_computes_the_models_logits(family_llm, steps):
    model = family_llm.model
    fast = FastCausalLM(model, fast_path_steps(steps, torch.device("cpu"), torch.float32))
    more = list(range(3, 3 + gemv_max_rows() + 2))
    for tokens in (more, [3, 17]):  # more rows than cpu_gemv takes, and few enough
        ids, positions = torch.tensor([tokens]), torch.arange(len(tokens))[None]
        with torch.inference_mode():
            expected = model.compute_logits(model(ids, positions))
            got = fast.compute_logits(fast(ids, positions, None))
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "capability,rows", [("AVX2", GEMV_MAX_ROWS["AVX2"]), ("AVX512", GEMV_MAX_ROWS["AVX512"]), ("DEFAULT", 3)]
)
def test_cpu_gemv_takes_as_many_rows_as_were_measured_for_the_cpus_vectors(monkeypatch, capability, rows):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert gemv_max_rows() == rows


def test_in_bfloat16_the_fast_path_is_fused_and_prepacked_within_bfloat16s_own_error(tiny):
    """The C kernels are float32 only (README, "In bfloat16"): a bfloat16 model on a CPU takes the two
    steps that are not, and their logits stay as close to the bfloat16 model's as those are to float32's."""
    steps = fast_path_steps(True, torch.device("cpu"), torch.bfloat16)
    assert steps == ("fused", "prepacked")
    model = LLM("tiny", dtype="bfloat16", device="cpu").model
    fast = FastCausalLM(model, steps)
    ids = torch.tensor([list(range(3, 40))])
    positions = torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        expected = model.compute_logits(model(ids, positions))
        got = fast.compute_logits(fast(ids, positions, None))
        in_float32 = tiny.model.compute_logits(tiny.model(ids, positions))
    bfloat16_error = (expected - in_float32).abs().max().item()
    assert 0 < bfloat16_error < 0.1, "the bfloat16 model should differ from float32 by rounding only"
    torch.testing.assert_close(got, expected, rtol=0, atol=bfloat16_error)


def test_the_gemv_bench_sends_every_matmul_through_the_loop_on_its_turn_only(tiny, monkeypatch):
    """``benchmarks.gemv_rows`` times the C loop against oneDNN: if its switch failed, it would time one
    of them twice and still print a table."""
    from minillm.benchmarks import gemv_rows
    from minillm.kernels import cpu_ops

    steps = fast_path_steps(["fused", "prepacked", "cpu_gemv"], torch.device("cpu"), torch.float32)
    linears = gemv_rows.step_linears(FastCausalLM(tiny.model, steps))
    rows_seen, loop = [], cpu_ops.linear_few_rows
    monkeypatch.setattr(cpu_ops, "linear_few_rows", lambda x, parts: rows_seen.append(len(x)) or loop(x, parts))
    gemv_rows.time_step(linears, 5, "cpu_gemv")
    assert rows_seen == [5] * len(linears)
    rows_seen.clear()
    gemv_rows.time_step(linears, 5, "prepacked")
    assert rows_seen == []


@pytest.mark.parametrize("engine", ["paged", "chunked"])
@pytest.mark.parametrize("steps", STEP_CHOICES, ids=str)
def test_the_fast_path_gives_the_eager_engines_greedy_tokens(family_llm, engine, steps):
    """A small pool (preemption), a small budget (chunks) and more requests than slots, so a prompt
    joins running decodes: every step shape. All arrive at once: arrival times are wall-clock, and a
    staggered arrival made preemption depend on how fast the machine ran the first requests."""
    options = {"block_size": 4, "num_gpu_blocks": 12, "max_num_seqs": 3}
    if engine == "chunked":
        options["max_num_batched_tokens"] = 8
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    eager = LLM(family_llm, engine=engine, attention_backend="torch", **options)
    llm = LLM(family_llm, engine=engine, fast_path=steps, **options)
    fast = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in fast] == [o.token_ids for o in eager.generate(PROMPTS, params)]
    assert llm.stats()["num_preemptions"] > 0  # the pool was tight enough to preempt
    runner = llm.llm_engine.runner
    assert runner.fast_path == (CPU_STEPS if steps is True else tuple(steps))
    assert runner.attention_backend == ("cpu" if "cpu_attention" in runner.fast_path else "torch")


def test_the_fast_path_with_swapping_and_prefix_caching_keeps_the_tokens(family_llm):
    prefix = list(range(50, 66))
    prompts = [prefix + p for p in PROMPTS]
    options = dict(block_size=4, num_gpu_blocks=24, max_num_seqs=3, preemption_mode="swap")
    options.update(enable_prefix_caching=True, max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    eager = LLM(family_llm, engine="chunked", attention_backend="torch", **options).generate(prompts, params)
    llm = LLM(family_llm, engine="chunked", fast_path=True, **options)
    assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in eager]
    assert llm.stats()["prefix_cache_hits"] > 0


def test_steps_a_device_cannot_take_are_left_out():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert fast_path_steps(True, cpu, torch.float32) == CPU_STEPS
    assert CPU_STEPS == tuple(s for s in FAST_PATH_STEPS if s != "compiled")
    assert fast_path_steps(True, cuda, torch.bfloat16) == ("fused", "compiled")  # oneDNN, the C kernels: the CPU's
    assert fast_path_steps(["compiled"], cpu, torch.float32) == ("compiled",)  # asked for, a CPU takes it too
    assert fast_path_steps(True, cpu, torch.bfloat16) == ("fused", "prepacked")  # the C kernels are float32's
    assert fast_path_steps(True, cpu, torch.float64) == ("fused",)  # oneDNN's linear takes no float64
    assert fast_path_steps(False, cpu, torch.float32) == ()
    assert fast_path_steps(["prepacked"], cpu, torch.float32) == ("prepacked",)


def test_an_explicit_attention_backend_wins_over_the_kernel_step(tiny):
    runner = LLM(tiny, engine="chunked", fast_path=True, attention_backend="torch").llm_engine.runner
    assert runner.attention_backend == "torch" and runner.fast_path == ("fused", "prepacked", "cpu_ops", "cpu_gemv")


def test_without_triton_a_gpu_takes_no_compiled_step(monkeypatch):
    monkeypatch.setattr(fast_model.importlib.util, "find_spec", lambda name: None)
    assert fast_path_steps(True, torch.device("cuda"), torch.bfloat16) == ("fused",)


def test_without_a_compiler_the_kernel_step_is_left_out_and_the_backend_refused(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CC", "no-such-compiler")
    cpu_build.load.cache_clear()
    try:
        assert "no C compiler found (looked for 'no-such-compiler'" in cpu_build.unavailable_reason()
        assert fast_path_steps(True, torch.device("cpu"), torch.float32) == ("fused", "prepacked")
        runner = LLM(tiny, engine="chunked", fast_path=True).llm_engine.runner
        assert runner.attention_backend == "torch" and runner.fast_path == ("fused", "prepacked")
        with pytest.raises(ValueError, match="attention_backend='cpu' is not available here: no C compiler"):
            LLM(tiny, engine="chunked", attention_backend="cpu")
    finally:
        cpu_build.load.cache_clear()  # the next test builds (or finds) the kernel again


def test_the_cpu_backend_is_refused_off_its_dtype():
    with pytest.raises(
        ValueError, match=r"attention_backend='cpu' runs on the CPU in torch.float32, got torch.bfloat16"
    ):
        LLM("tiny", engine="paged", dtype="bfloat16", device="cpu", attention_backend="cpu")


def test_the_readable_model_is_left_as_it_was(tiny):
    """The fast path keeps its own weights: the eager engines sharing the model still run it."""
    before = {n: p.clone() for n, p in tiny.model.named_parameters()}
    llm = LLM(tiny, engine="chunked", fast_path=True)
    assert type(llm.llm_engine.runner.model) is FastCausalLM
    assert all(torch.equal(before[n], p) for n, p in tiny.model.named_parameters())
    assert LLM(tiny, engine="chunked").llm_engine.runner.model is tiny.model


@pytest.mark.parametrize("bad", ["yes", 1, ["compile"], ("fused", "graphs"), None])
def test_a_bad_fast_path_is_refused_by_name(tiny, bad):
    with pytest.raises(ValueError, match=r"fast_path must be True, False or a list of steps from \('fused', "):
        LLM(tiny, engine="chunked", fast_path=bad)
    with pytest.raises(ValueError, match="fast_path"):
        build_engine("paged", tiny.model, tiny.device, None, fast_path=bad)


def test_engines_without_a_fast_path_refuse_it(tiny):
    with pytest.raises(ValueError, match=r"engine 'selective' does not take the option\(s\) \['fast_path'\]"):
        LLM(tiny, engine="selective", fast_path=True)
