"""``kv_cache_memory_bytes`` and ``gpu_memory_utilization``: a memory budget turned into KV blocks."""

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.kv.memory_budget import kv_block_bytes


@pytest.fixture(scope="module")
def tiny():
    return LLM("tiny", dtype="float32")


def block_bytes(llm, block_size=16):
    return kv_block_bytes(llm.config, torch.float32, block_size)


def test_one_block_is_keys_and_values_of_every_layer(tiny):
    cfg = tiny.config
    assert block_bytes(tiny, 16) == 2 * cfg.num_hidden_layers * 16 * cfg.num_key_value_heads * cfg.head_dim * 4


@pytest.mark.parametrize("engine", ["paged", "chunked"])
def test_a_byte_budget_buys_whole_blocks(tiny, engine):
    per_block = block_bytes(tiny, 8)
    llm = LLM("tiny", engine=engine, dtype="float32", block_size=8, kv_cache_memory_bytes=5 * per_block + per_block - 1)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert llm.stats()["num_total_blocks"] == 5  # a partial block is not a block
    runner = llm._engine.runner
    assert sum(t.numel() * t.element_size() for t in runner.k_caches + runner.v_caches) == 5 * per_block


@pytest.mark.parametrize("options, words", [
    ({"kv_cache_memory_bytes": 100}, "holds no block: one block of 16 tokens takes"),
    ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes must be an integer >= 1"),
    ({"kv_cache_memory_bytes": 1.5e6}, "kv_cache_memory_bytes must be an integer >= 1"),
    ({"kv_cache_memory_bytes": 2**20, "num_gpu_blocks": 4}, "at most one of .*num_gpu_blocks, kv_cache_memory_bytes"),
    ({"gpu_memory_utilization": 0.5, "kv_cache_memory_bytes": 2**20}, "at most one of"),
    ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be a fraction in \(0, 1\]"),
    ({"gpu_memory_utilization": 0}, r"gpu_memory_utilization must be a fraction in \(0, 1\]"),
])
def test_bad_budgets_name_the_option(options, words):
    with pytest.raises(ValueError, match=words):
        LLM("tiny", engine="paged", device="cpu", **options)


def test_gpu_memory_utilization_needs_a_gpu():
    with pytest.raises(ValueError, match="gpu_memory_utilization needs a CUDA device, got cpu"):
        LLM("tiny", engine="paged", device="cpu", gpu_memory_utilization=0.9)


def test_other_engines_do_not_take_a_kv_budget():
    with pytest.raises(ValueError, match="does not take the option"):
        LLM("tiny", engine="selective", kv_cache_memory_bytes=2**20)


def test_the_budget_reaches_the_simulator():
    from minillm import workloads
    from minillm.sim import Profile, simulate

    profile = Profile.load("h200-qwen3-0.6b")
    per_block = profile.kv_bytes_per_token * 16
    result = simulate("paged", workloads.fixed([10], [2]), profile, kv_cache_memory_bytes=int(7 * per_block))
    assert result.trace.num_gpu_blocks == 7


def fake_gpu(monkeypatch, free, total, ours):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: ours)


def test_gpu_memory_utilization_is_a_share_of_the_whole_gpu_less_what_this_process_holds(monkeypatch, tiny):
    from minillm.kv.memory_budget import resolve_kv_memory

    per_block = block_bytes(tiny, 16)
    total = 1000 * per_block
    fake_gpu(monkeypatch, free=600 * per_block, total=total, ours=100 * per_block)  # others hold 300 blocks' worth
    options = resolve_kv_memory({"block_size": 16, "gpu_memory_utilization": 0.5}, tiny.model, "cuda")
    assert options == {"block_size": 16, "num_gpu_blocks": 400}  # 500 blocks' share, less the 100 this process holds


def test_gpu_memory_utilization_refuses_a_share_others_hold(monkeypatch, tiny):
    from minillm.kv.memory_budget import resolve_kv_memory

    fake_gpu(monkeypatch, free=10**9, total=10**10, ours=10**8)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.5 asks for 5,000,000,000 bytes .* lower it"):
        resolve_kv_memory({"block_size": 16, "gpu_memory_utilization": 0.5}, tiny.model, "cuda")
    fake_gpu(monkeypatch, free=10**10, total=10**10, ours=6 * 10**9)
    with pytest.raises(ValueError, match="nothing is left for the KV cache"):
        resolve_kv_memory({"block_size": 16, "gpu_memory_utilization": 0.5}, tiny.model, "cuda")
