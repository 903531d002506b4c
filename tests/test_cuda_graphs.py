"""CUDA graphs for decode-only steps (``minillm.engines.cuda_graphs``) and for mixed steps in pieces
(``minillm.engines.piecewise_graphs``), through the CPU's stand-in graphs: the capture sizes, the
padding into a scratch block or past the step's tokens, which steps replay and which run eagerly,
and greedy tokens equal to the eager engine's. (On a GPU, ``gpu_check`` compares real graphs with
the eager path.)"""

import contextlib

import pytest
import torch

from minillm import SamplingParams
from minillm.engines import piecewise_graphs
from minillm.engines.cuda_graphs import CAPTURE_SIZES, EagerGraph, capture_sizes, padded_size
from minillm.engines.piecewise_graphs import EagerPieces
from minillm.models import compiled_ops

PROMPTS = [[(7 * i + j) % 200 + 1 for j in range(3 + 5 * i)] for i in range(11)]
# different lengths: the running batch shrinks through several capture sizes as requests finish
PARAMS = [SamplingParams(max_tokens=4 + 3 * i, ignore_eos=True) for i in range(11)]


def test_capture_sizes_are_vllms_and_a_batch_pads_up_to_the_next():
    assert CAPTURE_SIZES[:5] == (1, 2, 4, 8, 16) and CAPTURE_SIZES[-1] == 512
    steps = {a: b - a for a, b in zip(CAPTURE_SIZES[3:], CAPTURE_SIZES[4:])}
    assert all(step == (8 if a < 256 else 16) for a, step in steps.items())  # 8 apart up to 256, then 16
    batches = (1, 2, 3, 5, 8, 9, 17, 249, 257, 505, 512)
    assert [padded_size(n) for n in batches] == [1, 2, 4, 8, 8, 16, 24, 256, 272, 512, 512]
    assert padded_size(513) is None  # past the largest: eager


def test_the_sizes_captured_go_up_to_the_first_that_holds_max_num_seqs():
    assert capture_sizes(1) == (1,) and capture_sizes(8) == (1, 2, 4, 8)
    assert capture_sizes(9) == (1, 2, 4, 8, 16) and capture_sizes(17)[-1] == 24
    assert capture_sizes(None) == capture_sizes(600) == CAPTURE_SIZES  # unbounded, or past the largest: all


def num_tokens(step) -> int:
    return sum(step.num_scheduled_tokens.values())


def decode_only(step) -> bool:
    return bool(step.decode_ids) and not step.prefill_ids and not step.swapped_out_ids


@pytest.mark.parametrize("engine", ["paged", "chunked"])
def test_graphs_give_the_eager_engines_tokens_and_replay_every_decode_only_step(tiny64, engine_on, engine):
    eager = engine_on(tiny64, engine, block_size=4, max_num_seqs=16)
    graphed = engine_on(tiny64, engine, block_size=4, max_num_seqs=16, cuda_graphs=True)
    graphs = graphed.llm_engine.runner.graphs.graphs
    assert list(graphs) == [16, 8, 4, 2, 1]  # captured when the engine was built, the largest first
    captured = dict(graphs)
    want = [o.token_ids for o in eager.generate(PROMPTS, PARAMS)]
    assert [o.token_ids for o in graphed.generate(PROMPTS, PARAMS)] == want
    assert graphs == captured  # no step captured one of its own
    assert all(isinstance(g, EagerGraph) for g in graphs.values())
    sizes = [padded_size(len(s.decode_ids)) for s in graphed.trace if decode_only(s)]
    assert {3, 5} & {len(s.decode_ids) for s in graphed.trace}
    assert [graphs[n].num_replays for n in sorted(graphs)] == [sizes.count(n) for n in sorted(graphs)]
    assert sum(g.num_replays for g in graphs.values()) == len(sizes)  # and every other step ran eagerly
    padded = [s.num_input_tokens for s in graphed.trace if decode_only(s)]
    assert padded == sizes and sum(s.num_padding_tokens for s in graphed.trace) > 0  # the padding rows, counted
    assert any(len(s.decode_ids) not in CAPTURE_SIZES for s in graphed.trace if decode_only(s))  # some padded


@pytest.mark.parametrize("fast_path", [False, True, ["fused", "compiled"]], ids=str)
def test_mixed_steps_replay_their_pieces_and_give_the_eager_engines_tokens(tiny64, engine_on, fast_path, monkeypatch):
    """Every step with a prompt or a chunk in it, up to the token budget, runs its forward through
    the pieces of the next capture size up, attention between them on its real rows only. With the
    compiled ops (traced, as a GPU's would be; ``test_compiled_ops`` runs inductor's code), the
    residual stream they update in place crosses the cuts."""
    if isinstance(fast_path, list):
        torch._dynamo.reset()  # a fresh count towards torch's limit on recompilations
        monkeypatch.setattr(compiled_ops, "BACKEND", "aot_eager")
    options = dict(block_size=4, max_num_seqs=4, max_num_batched_tokens=40, fast_path=fast_path)
    eager = engine_on(tiny64, "chunked", **options)
    graphed = engine_on(tiny64, "chunked", cuda_graphs=True, **options)
    pieces = graphed.llm_engine.runner.piecewise.graphs
    assert list(pieces) == [40, 32, 24, 16, 8, 4, 2, 1] and all(isinstance(p, EagerPieces) for p in pieces.values())
    want = [o.token_ids for o in eager.generate(PROMPTS, PARAMS)]
    assert [o.token_ids for o in graphed.generate(PROMPTS, PARAMS)] == want
    mixed = [padded_size(num_tokens(s)) for s in graphed.trace if s.prefill_ids]
    assert len(set(mixed)) > 2 and any(num_tokens(s) not in CAPTURE_SIZES for s in graphed.trace if s.prefill_ids)
    assert [pieces[n].num_replays for n in sorted(pieces)] == [mixed.count(n) for n in sorted(pieces)]
    assert [s.num_input_tokens for s in graphed.trace if s.prefill_ids] == mixed  # padding included


def test_a_step_past_the_largest_piece_runs_eagerly(tiny64, engine_on):
    graphed = engine_on(tiny64, "paged", block_size=4, cuda_graphs=True)  # no token budget: pieces up to 512
    prompts = [[(3 * j) % 200 + 1 for j in range(600)], [5, 6, 7]]
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    want = [o.token_ids for o in engine_on(tiny64, "paged", block_size=4).generate(prompts, params)]
    assert [o.token_ids for o in graphed.generate(prompts, params)] == want
    pieces = graphed.llm_engine.runner.piecewise.graphs
    assert max(pieces) == 512 and num_tokens(graphed.trace[0]) == 603
    assert sum(p.num_replays for p in pieces.values()) == 0  # the prompts' step was eager, the rest decodes


def test_the_scratch_block_is_the_pools_own(tiny64, engine_on):
    llm = engine_on(tiny64, "paged", block_size=4, num_gpu_blocks=40, cuda_graphs=True)
    runner = llm.llm_engine.runner
    assert runner.k_caches[0].shape[0] == 41 and runner.graphs.scratch_block == 40
    assert llm.stats()["num_total_blocks"] == 40  # the block manager never hands it out
    llm.generate(PROMPTS[:3], SamplingParams(max_tokens=5, ignore_eos=True))
    assert llm.stats()["num_free_blocks"] == 40


def test_preemption_and_swaps_run_eagerly_and_tokens_still_match(tiny64, engine_on):
    prompts, params = PROMPTS[:6], SamplingParams(max_tokens=24, ignore_eos=True)
    want = [o.token_ids for o in tiny64.generate(prompts, params)]
    for mode in ("recompute", "swap"):
        llm = engine_on(tiny64, "paged", block_size=4, num_gpu_blocks=24, preemption_mode=mode, cuda_graphs=True)
        assert [o.token_ids for o in llm.generate(prompts, params)] == want, mode
        assert llm.stats()["num_preemptions"] > 0, mode


@pytest.mark.parametrize(("engine", "option"), [("sglang", "max_running_requests"), ("tgi", "max_batch_size")])
def test_graphs_follow_each_servers_bound_on_requests_at_once(tiny64, engine_on, engine, option):
    llm = engine_on(tiny64, engine, block_size=4, cuda_graphs=True, **{option: 5})
    assert sorted(llm.llm_engine.runner.graphs.graphs) == [1, 2, 4, 8]
    unbounded = engine_on(tiny64, "sglang", block_size=4, cuda_graphs=True)  # max_running_requests=None
    assert unbounded.llm_engine.runner.graphs.sizes == CAPTURE_SIZES


def test_cuda_graphs_must_be_a_bool(tiny64, engine_on):
    with pytest.raises(ValueError, match="cuda_graphs must be True or False, got 'yes'"):
        engine_on(tiny64, "chunked", cuda_graphs="yes")


def test_a_gpu_capture_cuts_one_piece_per_attention_call_and_replays_attention_between(tiny64, engine_on, monkeypatch):
    """The GPU path's control flow, with torch.cuda's graph calls recorded instead of made: the
    forward of ``size`` rows is captured as layers + 1 pieces, each begun and ended once, in one pool,
    and a replay runs the pieces in order with each layer's attention between two of them."""
    events = []

    class RecordedGraph:
        def capture_begin(self, pool=None):
            events.append(("begin", pool))

        def capture_end(self):
            events.append(("end",))

        def replay(self):
            events.append(("replay",))

    fake_stream = type("Stream", (), {"wait_stream": lambda self, other: None})()
    monkeypatch.setattr(torch.cuda, "CUDAGraph", RecordedGraph)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: fake_stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    graphs = engine_on(tiny64, "chunked", block_size=4, cuda_graphs=True).llm_engine.runner.piecewise
    graphs.pool, graphs.stream = "the pool", fake_stream
    with torch.inference_mode():
        pieces = piecewise_graphs.CapturedPieces(graphs, 8)
    layers = tiny64.model.config.num_hidden_layers
    assert len(pieces.pieces) == layers + 1 and pieces.hidden.shape == (8, tiny64.model.config.hidden_size)
    assert events == [("begin", "the pool"), ("end",)] * (layers + 1)
    events.clear()
    pieces.replay(lambda layer_idx: events.append(("attend", layer_idx)))
    assert events == [("replay",), *[e for i in range(layers) for e in (("attend", i), ("replay",))]]
