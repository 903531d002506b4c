"""``kv_cache_memory_bytes`` and ``gpu_memory_utilization``: a memory budget turned into KV blocks."""

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.kv import memory_budget
from minillm.kv.memory_budget import kv_block_bytes


def block_bytes(llm, block_size=16):
    return kv_block_bytes(llm.config, torch.float32, block_size)


def test_one_block_is_keys_and_values_of_every_layer(tiny):
    cfg = tiny.config
    assert block_bytes(tiny, 16) == 2 * cfg.num_hidden_layers * 16 * cfg.num_key_value_heads * cfg.head_dim * 4


@pytest.mark.parametrize("engine", ["paged", "chunked"])
def test_a_byte_budget_buys_whole_blocks(tiny, engine):
    per_block = block_bytes(tiny, 8)
    llm = LLM(tiny, engine=engine, block_size=8, kv_cache_memory_bytes=5 * per_block + per_block - 1)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert llm.stats()["num_total_blocks"] == 5  # a partial block is not a block
    runner = llm.llm_engine.runner
    assert sum(t.numel() * t.element_size() for t in runner.k_caches + runner.v_caches) == 5 * per_block


@pytest.mark.parametrize(
    "options, words",
    [
        ({"kv_cache_memory_bytes": 100}, "holds no block: one block of 16 tokens takes"),
        ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes must be an integer >= 1"),
        ({"kv_cache_memory_bytes": 1.5e6}, "kv_cache_memory_bytes must be an integer >= 1"),
        (
            {"kv_cache_memory_bytes": 2**20, "num_gpu_blocks": 4},
            "at most one of .*num_gpu_blocks, kv_cache_memory_bytes",
        ),
        ({"gpu_memory_utilization": 0.5, "kv_cache_memory_bytes": 2**20}, "at most one of"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be a fraction in \(0, 1\]"),
        ({"gpu_memory_utilization": 0}, r"gpu_memory_utilization must be a fraction in \(0, 1\]"),
    ],
)
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


class FakeGPU:
    """A GPU as ``torch.cuda`` reports it: ``total`` bytes, of which other processes hold ``others``
    and this one ``held`` (what PyTorch's caching allocator reserved, all of it allocated); ``peak``
    is the most it held since the last reset. A profile pass of ``n`` tokens needs ``activations +
    n * per_token`` bytes on top of what it holds."""

    def __init__(self, monkeypatch, total, others, held, activations=0, per_token=0):
        self.total, self.others, self.held, self.peak, self.activations = total, others, held, held, activations
        self.per_token, self.profiled_tokens = per_token, []
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - self.others - self.held, total))
        for held_now in ("memory_reserved", "memory_allocated"):
            monkeypatch.setattr(torch.cuda, held_now, lambda device=None: self.held)
        for peak in ("max_memory_reserved", "max_memory_allocated"):
            monkeypatch.setattr(torch.cuda, peak, lambda device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: setattr(self, "peak", self.held))
        real_profile = memory_budget.profile_forward

        def profile(model, num_tokens):
            real_profile(model, num_tokens)  # on the CPU here; on a GPU its activations raise the peak
            self.profiled_tokens.append(num_tokens)
            self.peak = max(self.peak, self.held + self.activations + num_tokens * self.per_token)

        monkeypatch.setattr(memory_budget, "profile_forward", profile)


def test_gpu_memory_utilization_is_a_share_of_the_whole_gpu_less_what_this_process_needs(monkeypatch, tiny):
    per_block = block_bytes(tiny, 16)
    # others hold 300 blocks' worth, this process 100 (the weights), and a step's activations 50 more
    gpu = FakeGPU(
        monkeypatch, total=1000 * per_block, others=300 * per_block, held=100 * per_block, activations=50 * per_block
    )
    options = memory_budget.resolve_kv_memory({"block_size": 16, "gpu_memory_utilization": 0.5}, tiny.model, "cuda")
    assert options == {"block_size": 16, "num_gpu_blocks": 350}  # 500 blocks' share, less the 150 at the peak
    assert len(gpu.profiled_tokens) == 1


def test_gpu_memory_utilization_refuses_a_share_others_hold(monkeypatch, tiny):
    FakeGPU(monkeypatch, total=10**10, others=10**10 - 10**9 - 10**8, held=10**8)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.5 asks for 5,000,000,000 bytes .* lower it"):
        memory_budget.resolve_kv_memory({"block_size": 16, "gpu_memory_utilization": 0.5}, tiny.model, "cuda")
    FakeGPU(monkeypatch, total=10**10, others=0, held=6 * 10**9)
    with pytest.raises(ValueError, match="nothing is left for the KV cache"):
        memory_budget.resolve_kv_memory({"block_size": 16, "gpu_memory_utilization": 0.5}, tiny.model, "cuda")
    with pytest.raises(ValueError, match=r"one step of \d+ tokens \(and CUDA graphs of up to 16\): nothing is left"):
        memory_budget.resolve_kv_memory({"block_size": 16, "gpu_memory_utilization": 0.5}, tiny.model, "cuda", 16)


@pytest.mark.parametrize("engine", ["paged", "chunked"])
def test_gpu_memory_utilization_is_worked_out_once_for_every_call(monkeypatch, tiny, engine):
    """One pool for the LLM's life: three calls reuse it. (When every call built an engine, the pool
    dropped by the last call was still reserved by PyTorch's caching allocator, so each new budget
    came out smaller, and soon nothing was left.)"""
    per_block = block_bytes(tiny, 16)
    gpu = FakeGPU(monkeypatch, total=1000 * per_block, others=0, held=100 * per_block)
    monkeypatch.setattr(memory_budget, "require_cuda", torch.device)  # the pool itself lives on this CPU
    budget = {"max_num_batched_tokens": 64} if engine == "chunked" else {}
    llm = LLM(tiny, engine=engine, gpu_memory_utilization=0.5, **budget)
    runner = llm.llm_engine.runner
    pool = [t.data_ptr() for t in runner.k_caches]
    assert llm.stats()["num_total_blocks"] == 400 and len(gpu.profiled_tokens) == 1
    gpu.held += 400 * per_block  # the pool, reserved for good
    for _ in range(3):
        outputs = llm.generate([[1, 2, 3], [4] * 20], SamplingParams(max_tokens=5, ignore_eos=True))
        assert [len(o.token_ids) for o in outputs] == [5, 5]
        assert llm.llm_engine.runner is runner and [t.data_ptr() for t in runner.k_caches] == pool
        stats = llm.stats()
        assert stats["num_free_blocks"] == stats["num_total_blocks"] == 400
    assert len(gpu.profiled_tokens) == 1


@pytest.mark.parametrize("engine", ["paged", "chunked"])
def test_cuda_graphs_memory_is_left_out_of_the_pool(monkeypatch, tiny, engine):
    """The graphs' memory pool keeps one step of the largest graph for good: the mixed steps' pieces
    of up to the token budget (64 tokens; 512, the largest capture size, without a budget), above
    the decode graphs' 16 rows for max_num_seqs=12. A second profile pass of that many tokens
    measures it, and the KV pool gets the rest."""
    per_block = block_bytes(tiny, 16)
    budget = {"max_num_batched_tokens": 64} if engine == "chunked" else {}
    graph_tokens = 64 if engine == "chunked" else 512
    sizes = {}
    for graphs in (False, True):
        gpu = FakeGPU(monkeypatch, total=10_000 * per_block, others=0, held=100 * per_block, per_token=per_block)
        monkeypatch.setattr(memory_budget, "require_cuda", torch.device)  # the pool itself lives on this CPU
        llm = LLM(tiny, engine=engine, gpu_memory_utilization=0.5, max_num_seqs=12, cuda_graphs=graphs, **budget)
        profile_tokens = 64 if engine == "chunked" else min(8192, tiny.model.config.max_position_embeddings)
        assert gpu.profiled_tokens == [profile_tokens, graph_tokens][: 1 + graphs]
        sizes[graphs] = llm.stats()["num_total_blocks"]
    assert sizes[False] - sizes[True] == graph_tokens  # its activations: per_block a token here
