"""The capacity tool on traffic that repeats itself: the mixes with a system prompt or a chat's history,
replayed the same at every rate, and what a prefix cache (``enable_prefix_caching``) adds to capacity."""

import json

import pytest

from minillm.capacity import (
    NUM_TURNS,
    SYSTEM_PROMPT_LENS,
    base_workload,
    capacity_workload,
    find_capacity,
    llm_target,
    simulator_target,
)
from minillm.cli import main
from minillm.workloads import repeated_tokens

SLOS = ["ttft_p95=0.5", "itl_p95=0.05"]


@pytest.mark.parametrize("mix, plain", [("chat + system prompt", "chat"), ("cpu chat + system prompt", "cpu chat")])
def test_every_request_starts_with_the_same_system_prompt(mix, plain):
    n = SYSTEM_PROMPT_LENS[mix]
    prompts = base_workload(mix, 20, seed=1).prompts
    assert all(p[:n] == prompts[0][:n] for p in prompts)
    # after it, each request is the plain mix's request of the same seed
    assert [p[n:] for p in prompts] == base_workload(plain, 20, seed=1).prompts


@pytest.mark.parametrize("mix", ["multi-turn chat", "cpu multi-turn chat"])
def test_a_chats_later_turn_resends_its_earlier_one(mix):
    workload = base_workload(mix, 40, seed=2)
    num_chats = 40 // NUM_TURNS[mix]
    for i in range(num_chats, 40):
        earlier, later = workload.prompts[i - num_chats], workload.prompts[i]
        assert later[: len(earlier)] == earlier and len(later) > len(earlier)
    assert repeated_tokens(workload) >= sum(len(p) for p in workload.prompts[:-num_chats])


def test_the_cpu_mixes_fit_the_tiny_models_positions():
    for mix in ("cpu chat + system prompt", "cpu multi-turn chat"):
        workload = base_workload(mix, 200)
        longest = max(len(p) + s.max_tokens for p, s in zip(workload.prompts, workload.sampling_params))
        assert longest <= 2048, mix


@pytest.mark.parametrize("mix", ["chat + system prompt", "multi-turn chat"])
def test_every_rate_replays_the_same_prompts(mix):
    seen = []
    run = simulator_target("chunked", enable_prefix_caching=True)

    def recording(workload):
        seen.append((workload.prompts, [s.max_tokens for s in workload.sampling_params], workload.arrival_times))
        return run(workload)

    find_capacity("chunked", SLOS, target=recording, mix=mix, num_requests=40, rate_range=(4, 64), rel_tol=0.5)
    assert len(seen) >= 3
    assert all(prompts == seen[0][0] and lens == seen[0][1] for prompts, lens, _ in seen)
    slow, fast = capacity_workload(mix, 40, rate=2.0), capacity_workload(mix, 40, rate=8.0)
    assert slow.prompts == fast.prompts
    assert slow.arrival_times == pytest.approx([4 * t for t in fast.arrival_times])


def test_caching_raises_the_capacity_of_the_system_prompt_mix():
    """Measured (simulator, 100 requests, default options): 21.7 req/s off, 29.3 on. With caching off
    every request holds its own copy of the 1,000-token prompt's KV blocks, so fewer requests fit the
    pool, and it computes the prompt again; with it on they share one copy."""

    def capacity(on: bool) -> float:
        kwargs = dict(mix="chat + system prompt", num_requests=100, rate_range=(4, 64), rel_tol=0.05)
        return find_capacity("chunked", SLOS, enable_prefix_caching=on, **kwargs).max_rate

    off, on = capacity(False), capacity(True)
    assert off is not None and on >= 1.25 * off, (off, on)


def test_llm_target_starts_every_rate_cold(tiny, engine_on):
    """One LLM serves every rate: without a reset the second run's first request would find its own
    prompt, cached by the first run."""
    llm = engine_on(tiny, "chunked", enable_prefix_caching=True)
    workload = capacity_workload("cpu chat + system prompt", 3, rate=4.0)
    run = llm_target(llm)
    for _ in range(2):
        run(workload)
        assert llm.last_outputs[0].num_cached_tokens == 0
    assert llm.stats()["prefix_cache_hits"] > 0  # the later requests found the system prompt


def test_the_real_engine_finds_a_capacity_with_caching_on(tiny, engine_on):
    llm = engine_on(tiny, "chunked", enable_prefix_caching=True)
    result = find_capacity(
        "chunked",
        ["ttft_p95=5", "itl_p95=1"],
        target=llm_target(llm),
        mix="cpu chat + system prompt",
        num_requests=6,
        rate_range=(8, 16),
        rel_tol=1.5,
    )
    assert [r.rate for r in result.rates] == [8, 16] and result.max_rate == 16
    assert llm.stats()["prefix_cache_hits"] > 0


def test_cli_passes_enable_prefix_caching(tmp_path):
    path = tmp_path / "capacity.json"
    args = ["capacity", "--slo", "ttft_p95=0.5", "--mix", "chat + system prompt", "--num-requests", "40"]
    args += ["--rate-min", "4", "--rate-max", "64", "--rel-tol", "0.5"]
    assert main([*args, "--enable-prefix-caching", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["engine_options"] == {"enable_prefix_caching": True}
    assert main([*args, "--json", str(path)]) == 0
    assert json.loads(path.read_text())["engine_options"] == {}


def test_cli_refuses_enable_prefix_caching_with_url(capsys):
    """A running server's cache was set when it started: the flag cannot reach it, so it is refused
    by name before anything is contacted (nothing listens at the URL)."""
    args = ["capacity", "--slo", "ttft_p95=0.5", "--url", "http://127.0.0.1:9/v1", "--model", "tiny"]
    assert main([*args, "--enable-prefix-caching"]) == 2
    err = capsys.readouterr().err
    assert "--enable-prefix-caching cannot go with --url" in err and "minillm serve" in err
