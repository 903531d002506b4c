"""Several simulated GPUs serving one stream of requests (``minillm.capacity.pools``): colocated
engines behind a round-robin deal, and prefill and decode pools with the KV cache crossing a link."""

import pytest

from minillm import SamplingParams
from minillm.capacity import at_rate, base_workload
from minillm.capacity.pools import colocated_target, disaggregated_target
from minillm.capacity.targets import simulator_target
from minillm.sim import Profile, simulate
from minillm.workloads import Workload, uniform

H200 = Profile.load("h200-qwen3-0.6b")
OPTIONS = dict(max_num_seqs=16, num_gpu_blocks=4096, max_num_batched_tokens=2048)
MIX = [(0.8, uniform(32, 256), uniform(16, 64)), (0.2, uniform(1024, 2048), uniform(16, 64))]


def _work(n=40, rate=50.0):
    return at_rate(base_workload(MIX, n, seed=1), rate)


def _numbers(run):
    return [(r.arrival_time, r.ttft, r.itl, r.e2e) for r in run.requests]


def test_one_colocated_gpu_is_the_simulator_itself():
    work = _work()
    assert _numbers(colocated_target(1, **OPTIONS)(work)) == _numbers(simulator_target(**OPTIONS)(work))


def test_two_colocated_gpus_each_take_every_other_request():
    work = _work()
    two = colocated_target(2, **OPTIONS)(work)
    half = Workload(work.prompts[::2], work.sampling_params[::2], work.arrival_times[::2])  # arrivals are sorted
    alone = simulate("chunked", half, H200, **OPTIONS)
    assert _numbers(two)[::2] == [
        (o.metrics.arrival_time, o.metrics.ttft, o.metrics.itl, o.metrics.e2e) for o in alone.outputs
    ]


def test_disaggregated_requests_get_every_token_their_first_from_the_prefill_pool():
    work = _work()
    run = disaggregated_target(1, 2, **OPTIONS)(work)
    assert [len(r.itl) + 1 for r in run.requests] == [p.max_tokens for p in work.sampling_params]
    prefill_only = Workload(
        work.prompts, [type(p)(max_tokens=1, ignore_eos=True) for p in work.sampling_params], work.arrival_times
    )
    alone = simulate("chunked", prefill_only, H200, **OPTIONS)
    assert [r.ttft for r in run.requests] == [o.metrics.ttft for o in alone.outputs]


@pytest.mark.parametrize("prompt_len", [40, 1500])
def test_the_kv_cache_crossing_the_link_delays_the_second_token(prompt_len):
    work = Workload([[7] * prompt_len], [SamplingParams(max_tokens=20, ignore_eos=True)], [0.0])
    fast = disaggregated_target(1, 1, link_bytes_per_s=1e15, **OPTIONS)(work).requests[0]
    slow = disaggregated_target(1, 1, link_bytes_per_s=1e11, **OPTIONS)(work).requests[0]
    kv_bytes = prompt_len * H200.kv_bytes_per_token
    assert slow.itl[0] - fast.itl[0] == pytest.approx(kv_bytes / 1e11 - kv_bytes / 1e15)
    assert slow.itl[1:] == pytest.approx(fast.itl[1:], rel=1e-9) and slow.ttft == fast.ttft  # only the transfer changed


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: colocated_target(0), "num_gpus must be an integer >= 1"),
        (lambda: disaggregated_target(1, 0), "num_decode must be an integer >= 1"),
        (lambda: disaggregated_target(1, 1, link_bytes_per_s=0), "link_bytes_per_s must be > 0"),
        (lambda: disaggregated_target(1, 1, max_num_seqs=0), "max_num_seqs must be an integer >= 1"),
    ],
)
def test_bad_values_are_refused_by_name(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# Tensor parallelism in the cost model: one rank's share of the work plus the pass's all-reduces.


def test_a_tensor_parallel_rank_reads_half_the_weights_and_pays_two_all_reduces_per_layer():
    from minillm.sim.cost_model import tensor_parallel

    tp = tensor_parallel(H200, 2, link_bytes_per_s=400e9, allreduce_latency_s=5e-6)
    layers, hidden = H200.model["num_hidden_layers"], H200.model["hidden_size"]
    assert tp.weight_bytes == H200.weight_bytes / 2 and tp.kv_bytes_per_token == H200.kv_bytes_per_token / 2
    for tokens in (1, 64, 4096):
        half = max(
            (H200.weight_bytes / 2 + H200.kv_bytes_per_token / 2 * tokens) / H200.memory_bandwidth,
            (H200.num_params * tokens + H200.attention_flops_per_pair / 2 * tokens) / H200.peak_flops,
        )
        # two all-reduces per layer; a ring all-reduce of B bytes sends 2(N-1)/N x B = B from each of 2 ranks
        comm = 2 * layers * 5e-6 + 2 * layers * hidden * 2 * tokens / 400e9
        expected = half + H200.forward_overhead + H200.seq_overhead + comm
        assert tp.forward_time(1, tokens, tokens, tokens) == pytest.approx(expected, rel=1e-12)
    assert tensor_parallel(H200, 1) is H200


def test_tensor_parallelism_cuts_a_long_prompts_time_to_first_token_in_the_simulator():
    from minillm.sim.cost_model import tensor_parallel

    work = Workload([list(range(1, 8001))], [SamplingParams(max_tokens=4, ignore_eos=True)], [0.0])
    options = dict(num_gpu_blocks=1024, max_num_batched_tokens=8192)
    one = simulate("chunked", work, H200, **options).outputs[0].metrics
    two = simulate("chunked", work, tensor_parallel(H200, 2), **options).outputs[0].metrics
    assert two.ttft < 0.75 * one.ttft, "a compute-bound prefill should split close to in half"


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (3, r"tensor_parallel_size=3 must divide the model's num_attention_heads \(16\)"),
        (0, "tensor_parallel_size must be an integer >= 1, got 0"),
    ],
)
def test_a_split_the_model_cannot_take_is_refused_by_name(size, message):
    from minillm.sim.cost_model import tensor_parallel

    with pytest.raises(ValueError, match=message):
        tensor_parallel(H200, size)


# Replicas behind a router (minillm.capacity.routing): round robin, and SGLang's cache-aware rule.


def test_a_round_robin_router_deals_exactly_as_the_colocated_pools_do():
    from minillm.capacity.pools import routed_target

    work = _work()
    assert _numbers(routed_target(2, "round_robin", **OPTIONS)(work)) == _numbers(colocated_target(2, **OPTIONS)(work))


def test_cache_aware_routing_follows_the_longest_match_above_the_threshold():
    from minillm.capacity.routing import CacheAware

    router = CacheAware(3)
    chat = list(range(100))
    assert router.select(chat, [0, 0, 0]) == 0  # nothing matches: the smallest tree (all empty: the first)
    assert router.select([7] * 50, [0, 0, 0]) == 1  # nothing matches: replica 0's tree is the big one now
    assert router.select(chat + [1, 2, 3], [5, 0, 0]) == 0, "97% of it is in replica 0's tree"
    assert router.select(chat[:20] + [9] * 80, [0, 0, 0]) == 2, "a 20% match is below 0.3: the smallest tree"


def test_cache_aware_routing_sends_to_the_shortest_queue_when_the_load_is_imbalanced():
    from minillm.capacity.routing import CacheAware

    chat = list(range(100))
    for loads, expected, why in [
        ([65, 0], 1, "65 more and over 1.5x: imbalanced, whatever is cached"),
        ([64, 0], 0, "64 more is within balance_abs_threshold: the cache wins"),
        ([150, 101], 0, "49 more is within balance_abs_threshold"),
        ([200, 134], 0, "66 more, but under 1.5x: balanced"),
    ]:
        router = CacheAware(2)
        router.select(chat, [0, 0])
        assert router.select(chat, loads) == expected, why


def test_cache_aware_routing_keeps_a_chats_turns_together_and_finds_their_history_cached():
    from minillm.capacity.pools import routed_target

    work = at_rate(base_workload("multi-turn chat", 64, seed=2), 20.0)  # 16 chats: not a multiple of 3
    options = dict(OPTIONS, enable_prefix_caching=True)
    rates = {}
    for policy in ("round_robin", "cache_aware"):
        target = routed_target(3, policy, **options)
        target(work)
        rates[policy] = target.hit_rates[-1]
    assert rates["cache_aware"] > 0.4 > 0.1 > rates["round_robin"], rates


def test_an_unknown_routing_policy_is_refused_by_name():
    from minillm.capacity.pools import routed_target

    with pytest.raises(ValueError, match="unknown routing policy 'random'; choose from round_robin, cache_aware"):
        routed_target(2, "random")


def test_another_model_on_the_same_device_counts_its_own_weights_and_kv():
    from minillm.sim.model_shape import profile_for_model

    shape = dict(H200.model, num_hidden_layers=2 * H200.model["num_hidden_layers"])
    deeper = profile_for_model(H200, shape, "deeper")
    assert deeper.memory_bandwidth == H200.memory_bandwidth and deeper.forward_overhead == H200.forward_overhead
    assert deeper.kv_bytes_per_token == 2 * H200.kv_bytes_per_token
    assert H200.weight_bytes < deeper.weight_bytes < 2 * H200.weight_bytes  # the embeddings are not doubled


def test_the_pools_keep_each_gpus_steps_for_the_timeline():
    work = _work(20)
    colocated, split = colocated_target(2, **OPTIONS), disaggregated_target(1, 2, **OPTIONS)
    colocated(work), split(work)
    assert list(colocated.traces) == ["GPU 0", "GPU 1"]
    assert list(split.traces) == ["prefill GPU 0", "decode GPU 0", "decode GPU 1"]
    assert all(not s.decode_ids for s in split.traces["prefill GPU 0"]), "the prefill pool never decodes"
    assert all(not s.prefill_ids for t in ("decode GPU 0", "decode GPU 1") for s in split.traces[t])


def test_a_link_without_bandwidth_or_a_profile_split_twice_is_refused():
    from minillm.sim.cost_model import tensor_parallel

    with pytest.raises(ValueError, match="link_bytes_per_s must be > 0, got 0"):
        tensor_parallel(H200, 2, link_bytes_per_s=0)
    with pytest.raises(ValueError, match="profile 'h200-qwen3-0.6b-tp2' is already split over 2 GPUs"):
        tensor_parallel(tensor_parallel(H200, 2), 2)
