import numpy as np
import pytest

from minillm import workloads as w


def test_anchor_benchmark_matches_the_anchor_workload():
    bench = w.anchor_benchmark()
    assert len(bench) == 256
    assert bench.num_prompt_tokens == 142_827  # figures from minillm/benchmarks/anchors/README.md
    assert bench.num_output_tokens == 133_966
    assert all(100 <= len(p) <= 1024 for p in bench.prompts)
    assert all(p.ignore_eos for p in bench.sampling_params)


def test_fixed_lengths_and_arrivals():
    wl = w.fixed([3, 5], [2, 7], arrival_times=[0.0, 0.5])
    assert [len(p) for p in wl.prompts] == [3, 5]
    assert [p.max_tokens for p in wl.sampling_params] == [2, 7]
    assert wl.arrival_times == [0.0, 0.5]
    with pytest.raises(ValueError, match="output_lens"):
        w.fixed([1, 2], [1])


def test_length_distributions_stay_in_range():
    rng = np.random.default_rng(0)
    assert all(4 <= n <= 9 for n in w.uniform(4, 9)(1000, rng))
    logn = w.lognormal(median=50, sigma=1.0, low=2, high=500)(2000, rng)
    assert all(2 <= n <= 500 for n in logn)
    assert 40 <= np.median(logn) <= 60
    mix = w.mixture((0.75, w.uniform(1, 10)), (0.25, w.uniform(100, 110)))(4000, rng)
    long_share = np.mean([n >= 100 for n in mix])
    assert 0.7 * 0.25 < long_share < 1.3 * 0.25


def test_gamma_lengths_keep_the_mean_and_spread_by_cv():
    rng = np.random.default_rng(0)
    assert w.gamma_lengths(128, 0.0)(5, rng) == [128] * 5
    for cv in (0.5, 1.0, 2.0):
        lens = np.array(w.gamma_lengths(128, cv, low=1, high=100_000)(20_000, rng))
        assert lens.min() >= 1
        assert lens.mean() == pytest.approx(128, rel=0.05)
        assert lens.std() / lens.mean() == pytest.approx(cv, rel=0.1)
    assert max(w.gamma_lengths(128, 2.0, high=512)(2000, rng)) == 512
    with pytest.raises(ValueError, match="cv"):
        w.gamma_lengths(128, -1.0)


def test_poisson_arrivals_have_the_requested_rate():
    times = w.poisson_arrivals(5000, rate=20.0, seed=1)
    assert times == sorted(times) and times[0] > 0
    assert len(times) / times[-1] == pytest.approx(20.0, rel=0.05)
    with pytest.raises(ValueError, match="rate"):
        w.poisson_arrivals(3, rate=0)


def test_random_workload_is_seeded():
    a = w.random_workload(20, w.uniform(2, 30), w.uniform(1, 10), rate=5.0, seed=3)
    b = w.random_workload(20, w.uniform(2, 30), w.uniform(1, 10), rate=5.0, seed=3)
    assert a.prompts == b.prompts and a.arrival_times == b.arrival_times
    assert w.random_workload(20, w.uniform(2, 30), w.uniform(1, 10), seed=3).arrival_times == [0.0] * 20


def test_two_slot_example_shape():
    wl = w.two_slot_example()
    assert [p.max_tokens for p in wl.sampling_params] == [2, 4, 2]
    assert wl.arrival_times == [0.0, 0.0, 0.0]


def test_workload_runs_through_generate(tiny):
    wl = w.random_workload(3, w.uniform(2, 6), w.uniform(1, 3), vocab_size=256, seed=0)
    outs = tiny.generate(wl.prompts, wl.sampling_params, wl.arrival_times)
    assert [len(o.token_ids) for o in outs] == [p.max_tokens for p in wl.sampling_params]


def test_shared_prefix_requests_start_with_the_same_tokens():
    wl = w.shared_prefix(6, prefix_len=20, suffix_lens=w.uniform(1, 5), output_lens=w.uniform(3, 3), rate=10.0)
    assert all(p[:20] == wl.prompts[0][:20] for p in wl.prompts)
    assert all(21 <= len(p) <= 25 for p in wl.prompts) and all(s.max_tokens == 3 for s in wl.sampling_params)
    assert wl.arrival_times == sorted(wl.arrival_times) and wl.arrival_times[0] > 0
    assert w.repeated_tokens(wl) >= 5 * 20  # every later request repeats the prefix


def test_multi_turn_resends_each_turns_prompt_and_answer():
    wl = w.multi_turn(3, num_turns=3, message_lens=w.uniform(4, 8), output_lens=w.uniform(5, 5), think_time=1.0)
    assert wl.arrival_times == [0.0] * 3 + [1.0] * 3 + [2.0] * 3
    for first, second in ((0, 3), (3, 6)):
        for c in range(3):  # the same conversation, one turn later
            earlier, later = wl.prompts[first + c], wl.prompts[second + c]
            assert later[: len(earlier)] == earlier and len(later) >= len(earlier) + 5 + 4
    # Repeated: each turn after the first repeats its conversation's previous prompt (the stand-in answer is new).
    assert w.repeated_tokens(wl) == sum(len(wl.prompts[i]) for i in range(6))


def test_repeated_tokens_counts_only_what_an_earlier_prompt_began_with():
    wl = w.Workload([[1, 2, 3], [1, 2, 4], [2, 3], [1, 2, 3, 5]], [None] * 4, [0.0] * 4)
    assert w.repeated_tokens(wl) == 0 + 2 + 0 + 3
