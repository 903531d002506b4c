"""CUDA graphs for decode-only steps (``minillm.engines.cuda_graphs``), through the CPU's stand-in
graphs: the capture sizes, the padding into a scratch block, which steps replay and which run
eagerly, and greedy tokens equal to the eager engine's. (On a GPU, ``gpu_check`` compares real
graphs with the eager path.)"""

import pytest

from minillm import SamplingParams
from minillm.engines.cuda_graphs import CAPTURE_SIZES, EagerGraph, capture_sizes, padded_size

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
    assert any(len(s.decode_ids) not in CAPTURE_SIZES for s in graphed.trace if decode_only(s))  # some padded


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
