"""Prefix caching (``enable_prefix_caching``): blocks found by a chained hash, shared by reference
count, kept on the free queue after their last holder finishes and evicted least recently freed
first; and, whatever the workload, never a changed token."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm import LLM, SamplingParams
from minillm.kv.prefix_cache import FreeBlockQueue, PrefixCachingBlockManager, hash_block
from minillm.request import Request
from minillm.sim import simulate
from minillm.workloads import Workload

BS = 4


def computed(request_id: str, tokens: list[int], bm: PrefixCachingBlockManager) -> Request:
    """A request whose ``tokens`` are all computed in blocks of ``bm``, and named in its cache."""
    r = Request(request_id, tokens, SamplingParams(max_tokens=4), 0.0)
    assert bm.allocate_slots(r, len(tokens))
    r.num_computed_tokens = len(tokens)
    bm.cache_full_blocks(r)
    return r


# --- the block manager ------------------------------------------------------------------------


def test_a_block_is_named_by_its_tokens_and_every_token_before_it():
    assert hash_block(None, [1, 2, 3, 4]) == hash_block(None, (1, 2, 3, 4))
    assert hash_block(hash_block(None, [1, 2, 3, 4]), [5, 6, 7, 8]) != hash_block(
        hash_block(None, [9, 9, 9, 9]), [5, 6, 7, 8]
    )
    bm = PrefixCachingBlockManager(8, BS)
    computed("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], bm)  # two full blocks and a partial one
    assert len(bm.cached_block_ids) == 2  # the partial block is still being written: not named
    table = bm.get_block_table("a")
    assert bm.find_cached_blocks([1, 2, 3, 4, 5, 6, 7, 8, 0]) == table[:2]
    assert bm.find_cached_blocks([1, 2, 3, 4, 0, 6, 7, 8]) == table[:1]  # stops at the first miss
    assert bm.find_cached_blocks([0, 2, 3, 4, 5, 6, 7, 8]) == []  # same second block, other prefix: a miss
    assert bm.find_cached_blocks([1, 2, 3]) == []  # no full block to look up


def test_shared_blocks_are_counted_and_a_freed_cached_block_stays_findable_until_evicted():
    bm = PrefixCachingBlockManager(4, BS)
    a = computed("a", [1, 2, 3, 4, 5, 6, 7, 8], bm)
    shared = bm.find_cached_blocks([1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.share_cached_blocks("b", shared)
    assert [bm.ref_counts[b] for b in shared] == [2, 2]
    bm.free(a)
    assert [bm.ref_counts[b] for b in shared] == [1, 1] and bm.num_free_blocks == 2  # b still holds them
    bm.free("b")
    assert bm.num_free_blocks == 4 and bm.find_cached_blocks([1, 2, 3, 4, 5, 6, 7, 8]) == shared
    # A hit on a free cached block takes it off the free queue: it cannot be evicted while held.
    bm.share_cached_blocks("c", shared[:1])
    assert shared[0] not in bm.free_block_ids and bm.num_free_blocks == 3


def test_eviction_takes_the_least_recently_freed_block_and_forgets_its_name():
    bm = PrefixCachingBlockManager(3, BS)
    a = computed("a", [1, 1, 1, 1], bm)
    b = computed("b", [2, 2, 2, 2], bm)
    (block_a,), (block_b,) = bm.get_block_table("a"), bm.get_block_table("b")
    bm.free(a)
    bm.free(b)  # free queue: the never-used block, then a's, then b's
    c = Request("c", [3] * 8, SamplingParams(max_tokens=1), 0.0)
    assert bm.allocate_slots(c, 8)  # takes the never-used block and a's, the least recently freed
    assert block_a in bm.get_block_table("c") and block_b not in bm.get_block_table("c")
    assert bm.find_cached_blocks([1, 1, 1, 1]) == []  # a's block was overwritten: its name is gone
    assert bm.find_cached_blocks([2, 2, 2, 2]) == [block_b]


def test_reset_prefix_cache_is_refused_while_blocks_are_held():
    bm = PrefixCachingBlockManager(4, BS)
    a = computed("a", [1, 2, 3, 4], bm)
    assert bm.reset_prefix_cache() is False and bm.find_cached_blocks([1, 2, 3, 4])
    bm.free(a)
    assert bm.reset_prefix_cache() is True and bm.find_cached_blocks([1, 2, 3, 4]) == []


def test_the_free_queue_pops_the_oldest_and_removes_from_the_middle():
    q = FreeBlockQueue(range(4))
    q.remove(1)
    q.append(1)
    assert [q.popleft(), q.popleft()] == [0, 2] and list(q) == [3, 1] and len(q) == 2 and 3 in q


# --- in the engine ----------------------------------------------------------------------------


def shared_prefix_prompts(n: int, prefix_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(1, 250) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(1, 250) for _ in range(rng.randrange(1, 30))] for _ in range(n)]


@pytest.mark.parametrize("engine", ["paged", "chunked"])
def test_caching_changes_no_token_and_counts_the_prefix_it_found(engine):
    prompts = shared_prefix_prompts(10, prefix_len=70)
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    off = LLM("tiny", engine=engine, max_num_seqs=4, block_size=16)
    on = LLM("tiny", engine=engine, max_num_seqs=4, block_size=16, enable_prefix_caching=True)
    reference = off.generate(prompts, sp)
    first, again = on.generate(prompts, sp), on.generate(prompts, sp)
    for outs in (first, again):
        assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    # The first four are admitted together, before any block is computed; the later six find the
    # prefix's four full blocks (64 of its 70 tokens).
    assert [o.num_cached_tokens for o in first] == [0] * 4 + [64] * 6
    assert all(o.num_cached_tokens >= 64 for o in again)  # now each finds its own prompt's blocks too
    assert all(o.num_cached_tokens == 0 for o in reference)
    stats = on.stats()
    assert stats["prefix_cache_hits"] == sum(o.num_cached_tokens for o in first + again)
    assert stats["prefix_cache_queries"] == 2 * sum(len(p) for p in prompts)
    assert stats["prefix_cache_hit_rate"] == stats["prefix_cache_hits"] / stats["prefix_cache_queries"]
    assert stats["num_free_blocks"] == stats["num_total_blocks"]  # nothing leaked


def test_a_whole_prompt_found_in_the_cache_still_computes_its_last_token():
    llm = LLM("tiny", engine="paged", block_size=16, enable_prefix_caching=True)
    prompt = list(range(1, 33))  # exactly two full blocks
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    first = llm.generate([prompt], sp)[0]
    second = llm.generate([prompt], sp)[0]
    assert second.token_ids == first.token_ids
    assert second.num_cached_tokens == 16  # the second block holds the last prompt token: computed again
    assert llm.trace[0].num_scheduled_tokens[second.request_id] == 16


def test_reset_prefix_cache_makes_the_next_call_start_cold():
    llm = LLM("tiny", engine="chunked", block_size=16, enable_prefix_caching=True)
    prompt, sp = list(range(1, 50)), SamplingParams(max_tokens=2, ignore_eos=True)
    llm.generate([prompt], sp)
    assert llm.generate([prompt], sp)[0].num_cached_tokens == 48
    assert llm.reset_prefix_cache() is True
    assert llm.generate([prompt], sp)[0].num_cached_tokens == 0
    assert LLM("tiny", engine="paged").reset_prefix_cache() is False  # caching off: nothing to forget


def test_enable_prefix_caching_must_be_a_bool():
    with pytest.raises(ValueError, match="enable_prefix_caching must be True or False, got 'yes'"):
        LLM("tiny", engine="paged", enable_prefix_caching="yes")
    with pytest.raises(ValueError, match="does not take the option"):
        LLM("tiny", engine="selective", enable_prefix_caching=True)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    engine=st.sampled_from(["paged", "chunked"]),
    preemption_mode=st.sampled_from(["recompute", "swap"]),
    num_gpu_blocks=st.integers(24, 48),  # the longest request needs 23 blocks; four at once need more
    temperature=st.sampled_from([0.0, 1.0]),
)
def test_outputs_never_change_with_caching_under_pool_pressure(
    seed, engine, preemption_mode, num_gpu_blocks, temperature
):
    rng = random.Random(seed)
    prompts = shared_prefix_prompts(8, prefix_len=rng.randrange(4, 40), seed=seed)
    prompts += [p[: rng.randrange(1, len(p) + 1)] for p in rng.sample(prompts, 3)]  # prefixes of other prompts
    prompts.append(prompts[0][4:] or [1])  # prompt 0's second block first: same tokens, another position
    params = [
        SamplingParams(max_tokens=rng.randrange(1, 24), temperature=temperature, seed=i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    arrivals = sorted(rng.uniform(0, 0.05) for _ in prompts)
    options = dict(engine=engine, max_num_seqs=4, block_size=4, num_gpu_blocks=num_gpu_blocks)
    options.update(preemption_mode=preemption_mode)
    if engine == "chunked":
        options["max_num_batched_tokens"] = rng.choice([8, 32, 512])
    runs = []
    for caching in (False, True):
        llm = LLM("tiny", enable_prefix_caching=caching, **options)
        runs.append(llm.generate(prompts, params, arrivals))
        stats = llm.stats()
        assert stats["num_free_blocks"] == stats["num_total_blocks"], "a block leaked"
    assert [o.token_ids for o in runs[1]] == [o.token_ids for o in runs[0]]


def test_the_simulator_runs_the_same_cache():
    prompts = shared_prefix_prompts(40, prefix_len=400)
    sp = [SamplingParams(max_tokens=20, ignore_eos=True)] * len(prompts)
    w = Workload(prompts, sp, [0.05 * i for i in range(len(prompts))])
    off, on = (simulate("chunked", w, max_num_seqs=8, enable_prefix_caching=c) for c in (False, True))
    assert sum(o.num_cached_tokens for o in on.outputs) >= 39 * 384  # every later request finds the prefix's 24 blocks
    ttft = [r.summary["time_to_first_token_seconds"]["p50"] for r in (off, on)]
    assert ttft[1] < ttft[0]


def test_metrics_count_the_prefix_cache_queries_and_hits():
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from minillm.server.launcher import serve_in_thread

    llm = LLM("tiny", engine="chunked", block_size=16, enable_prefix_caching=True)
    prompt = list(range(1, 40))
    with serve_in_thread(llm, model_name="tiny") as server:
        for _ in range(2):
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
            assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200
        text = httpx.get(server.url + "/metrics").text
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert values["minillm:prefix_cache_queries_total"] == 2 * 39
    assert values["minillm:prefix_cache_hits_total"] == 32  # the second request found the first's two full blocks


def test_a_later_turn_of_a_chat_finds_its_earlier_prompt():
    from minillm.workloads import multi_turn, uniform

    w = multi_turn(4, num_turns=3, message_lens=uniform(40, 80), output_lens=uniform(10, 20), think_time=1.0)
    run = simulate("chunked", w, max_num_seqs=8, enable_prefix_caching=True)  # 1 s apart: each turn has finished
    first_turn = {tuple(p[:40]): p for p in w.prompts[:4]}
    for prompt, out in zip(w.prompts[4:8], run.outputs[4:8]):
        earlier = first_turn[tuple(prompt[:40])]
        assert out.num_cached_tokens == len(earlier) // 16 * 16  # its first turn's full blocks, no more
