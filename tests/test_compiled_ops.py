"""minillm.models.compiled_ops (the fast path's ``compiled`` step: the small ops through
``torch.compile``): the readable model's ops, in place where ``cpu_ops``'s are, traced whole; the
engine compiles a few graphs when it is built and none while it runs; and it gives the eager tokens
with inductor's real code (C++ here; Triton on a GPU, which ``gpu_check`` runs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minillm import LLM, SamplingParams
from minillm.kernels import cpu_build
from minillm.models import compiled_ops
from minillm.models.llama import rms_norm
from tests.hf_models import make_hf_model
from tests.rotary_case import check_q_and_k_rotated_in_place

PROMPTS = [[5, 9, 2, 7, 1, 3], [4, 4, 8], list(range(10, 40)), [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
OPTIONS = {"block_size": 4, "num_gpu_blocks": 12, "max_num_seqs": 3, "max_num_batched_tokens": 8}


@pytest.fixture
def graphs(monkeypatch) -> list:
    """The graphs the ops are compiled into from here on, each traced whole and run as traced."""
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()  # no graph another test compiled (nor its count towards the recompile limit)
    monkeypatch.setattr(compiled_ops, "BACKEND", counting_backend)
    yield graphs
    torch._dynamo.reset()


@torch.no_grad()
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_each_op_is_the_readable_models(graphs, rows):
    torch.manual_seed(0)
    ops, weight = compiled_ops.ops(), torch.randn(80)
    x, residual = torch.randn(rows, 80) * 30, torch.randn(rows, 80)
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5))
    expected_stream = residual + x
    out = ops.add_rms_norm(x, residual, weight, 1e-5)
    torch.testing.assert_close(residual, expected_stream)  # updated in place, as cpu_ops does
    torch.testing.assert_close(out, rms_norm(expected_stream, weight, 1e-5))
    gate_up = torch.randn(rows, 2 * 48)
    torch.testing.assert_close(ops.silu_and_mul(gate_up), F.silu(gate_up[:, :48]) * gate_up[:, 48:])
    assert graphs  # they ran compiled


@torch.no_grad()
def test_rotary_embedding_rotates_q_and_k_inside_one_row_in_place(graphs):
    check_q_and_k_rotated_in_place(compiled_ops.ops().rotary_embedding_)


def test_the_engine_compiles_a_few_graphs_when_built_and_its_runs_none(graphs):
    """Then prompts of 3 to 30 tokens in chunks of up to 8, and decodes of 1 to 3 requests: steps of
    many sizes from 1 to 8 rows; and a second run with other prompts."""
    base = LLM(make_hf_model("qwen3"), dtype="float32", device="cpu", num_threads=1)
    llm = LLM(base, engine="chunked", fast_path=["fused", "compiled"], **OPTIONS)
    # each of 5 ops (RMSNorm twice: on the hidden states, and on q's and k's heads) for one row and
    # for any other count: torch specializes a dimension of size 1
    assert 0 < len(graphs) <= 10
    built = len(graphs)
    llm.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))
    assert len({step.num_input_tokens for step in llm.trace}) >= 5
    llm.generate([list(range(20, 45)), [7] * 17, [1, 2]], SamplingParams(max_tokens=20, ignore_eos=True))
    assert len(graphs) == built


@pytest.mark.skipif(cpu_build.unavailable_reason() is not None, reason="inductor's C++ needs a C compiler")
def test_the_engine_gives_the_eager_tokens_with_inductors_code(monkeypatch):
    """The real compiler (``BACKEND`` as shipped), on the family with q and k norms; chunks,
    preemption and decodes of 1 to 3 requests."""
    assert compiled_ops.BACKEND == "inductor"
    base = LLM(make_hf_model("qwen3"), dtype="float32", device="cpu", num_threads=1)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    eager = LLM(base, engine="chunked", attention_backend="torch", **OPTIONS).generate(PROMPTS, params)
    llm = LLM(base, engine="chunked", fast_path=["fused", "compiled"], **OPTIONS)
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == [o.token_ids for o in eager]
    assert llm.stats()["num_preemptions"] > 0


def test_cpu_ops_and_compiled_are_refused_together(tiny):
    with pytest.raises(ValueError, match="fast_path: 'cpu_ops' and 'compiled' run the same ops two ways"):
        LLM(tiny, engine="chunked", fast_path=["cpu_ops", "compiled"])
