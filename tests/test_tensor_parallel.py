"""Chapter 10's tensor parallelism (``tensor_parallel_size=N`` on the paged engines): N processes,
each with its slice of the heads and channels, give the one-process engine's greedy and sampled
tokens on every model family, with chunks, preemption (both modes) and prefix caching; a worker that
dies or a step that is interrupted stops every worker and the next call starts afresh; no process
outlives its LLM or its driver; bad values are refused by name before anything starts."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.distributed.tensor_parallel import shard_config, shard_state_dict
from tests.hf_models import make_hf_model

FAMILIES = ("llama-biases", "qwen2", "qwen3", "smollm2")  # o_proj and MLP biases, q/k/v biases, q/k norms, tied
PROMPTS = [[5, 9, 2, 7, 1, 3], [4, 4, 8], list(range(10, 40)), [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
# a small pool (preemption), a small budget (chunks), more requests than slots
TIGHT = {"block_size": 4, "num_gpu_blocks": 12, "max_num_seqs": 3, "max_num_batched_tokens": 8}


def workers(llm: LLM) -> list[multiprocessing.Process]:
    """The LLM's worker processes that are still running."""
    return [p for p in llm.llm_engine.runner.workers.procs if p.is_alive()]


@pytest.fixture(scope="module", params=FAMILIES)
def family_llm(request) -> LLM:
    return LLM(make_hf_model(request.param, torch.float64), dtype="float64", device="cpu", num_threads=1)


@pytest.fixture(scope="module")
def qwen3_llm() -> LLM:
    """For the tests of a worker's death and an interrupt: what they test does not depend on the family."""
    return LLM(make_hf_model("qwen3", torch.float64), dtype="float64", device="cpu", num_threads=1)


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_two_ranks_give_one_ranks_greedy_tokens(family_llm, preemption_mode):
    one = LLM(family_llm, engine="chunked", preemption_mode=preemption_mode, **TIGHT)
    two = LLM(family_llm, engine="chunked", preemption_mode=preemption_mode, tensor_parallel_size=2, **TIGHT)
    expected = [o.token_ids for o in one.generate(PROMPTS, GREEDY)]
    assert [o.token_ids for o in two.generate(PROMPTS, GREEDY)] == expected
    assert two.llm_engine.scheduler.num_preemptions > 0, "the pool was meant to be too small for all four"
    (worker,) = workers(two)
    del two
    gc.collect()
    worker.join(10)
    assert not worker.is_alive(), "an LLM that is gone leaves no worker behind"


def test_sampled_tokens_and_prefix_caching_match_too(family_llm):
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=7)
    shared = [list(range(1, 17)) + p for p in PROMPTS]  # 16 shared tokens: four cached blocks
    options = {"block_size": 4, "enable_prefix_caching": True}
    one = LLM(family_llm, engine="paged", **options)
    two = LLM(family_llm, engine="paged", tensor_parallel_size=2, **options)
    for _ in range(2):  # the second call hits the cache
        expected = [o.token_ids for o in one.generate(shared, params)]
        assert [o.token_ids for o in two.generate(shared, params)] == expected
    assert two.llm_engine.scheduler.prefix_cache_hits > 0


def test_each_rank_holds_its_share_of_heads_channels_and_kv_pool(family_llm):
    cfg = family_llm.config
    two = LLM(family_llm, engine="paged", tensor_parallel_size=2, block_size=4, num_gpu_blocks=8)
    runner = two.llm_engine.runner
    assert runner.model.config == shard_config(cfg, 2)
    assert runner.k_caches[0].shape == (8, 4, cfg.num_key_value_heads // 2, cfg.head_dim)
    full = family_llm.model.state_dict()
    parts = [shard_state_dict(family_llm.model, rank, 2) for rank in range(2)]
    q = "model.layers.0.self_attn.q_proj.weight"
    down = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(torch.cat([p[q] for p in parts], dim=0), full[q])  # column-parallel: rows cut
    assert torch.equal(torch.cat([p[down] for p in parts], dim=1), full[down])  # row-parallel: columns cut


def test_a_dead_worker_raises_and_the_next_call_starts_new_workers(qwen3_llm):
    two = LLM(qwen3_llm, engine="chunked", tensor_parallel_size=2, **TIGHT)
    expected = [o.token_ids for o in two.generate(PROMPTS, GREEDY)]
    (worker,) = workers(two)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(5)
    with pytest.raises(RuntimeError, match=r"tensor-parallel worker 1 exited \(exit code -9\)"):
        two.generate(PROMPTS, GREEDY)
    assert workers(two) == []
    assert [o.token_ids for o in two.generate(PROMPTS, GREEDY)] == expected
    assert len(workers(two)) == 1


def test_an_interrupted_step_stops_the_workers_and_the_llm_recovers(qwen3_llm, monkeypatch):
    two = LLM(qwen3_llm, engine="chunked", tensor_parallel_size=2, **TIGHT)
    expected = [o.token_ids for o in two.generate(PROMPTS, GREEDY)]
    runner = two.llm_engine.runner

    def interrupted(inputs):  # Ctrl-C after the step went to the worker, before the driver's shard ran
        monkeypatch.undo()
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "forward", interrupted)
    (worker,) = workers(two)
    with pytest.raises(KeyboardInterrupt):
        two.generate(PROMPTS, GREEDY)
    assert not worker.is_alive(), "the worker waiting in an all-reduce was stopped"
    assert [o.token_ids for o in two.generate(PROMPTS, GREEDY)] == expected


DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from minillm import LLM, SamplingParams
    if __name__ == "__main__":
        llm = LLM("tiny", engine="chunked", tensor_parallel_size=2)
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
        import multiprocessing
        print(*[p.pid for p in multiprocessing.active_children() if p.name.startswith("minillm-tp-")], flush=True)
        time.sleep(float(sys.argv[1]))
    """
)


@pytest.mark.parametrize("end", ["exits", "killed"])
def test_no_worker_outlives_its_driver(tmp_path, end):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    seconds = "0" if end == "exits" else "60"
    proc = subprocess.Popen([sys.executable, str(script), seconds], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 1
    if end == "killed":
        proc.kill()  # SIGKILL: no atexit, no finalizer; the worker sees its pipe close
    proc.wait(30)
    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), f"worker {pids} still running after its driver {end}"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has ended; only its parent has not reaped it
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be an integer >= 1, got 0"),
        ({"tensor_parallel_size": "2"}, "tensor_parallel_size must be an integer >= 1, got '2'"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size must be an integer >= 1, got True"),
        ({"tensor_parallel_size": 2, "fast_path": True}, "fast_path=True cannot be combined with tensor_parallel_size"),
        ({"tensor_parallel_size": 2, "cuda_graphs": True}, "cuda_graphs=True cannot be combined"),
    ],
)
def test_bad_values_are_refused_by_name_before_anything_loads(options, message, monkeypatch):
    import minillm.llm

    monkeypatch.setattr(minillm.llm, "load_model", lambda *a: pytest.fail("the model loaded before the check"))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("'", "'")):
        LLM("tiny", engine="chunked", **options)


def test_a_size_that_does_not_divide_the_heads_is_named_with_the_sizes_that_do(tiny):
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 must divide the model's num_attention_heads \(4\)"):
        LLM(tiny, engine="chunked", tensor_parallel_size=3)


def test_the_engines_without_a_paged_runner_do_not_take_it(tiny):
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(tiny, engine="continuous", tensor_parallel_size=2)


def test_new_workers_are_not_started_under_requests_that_hold_kv_blocks(tiny):
    two = LLM(tiny, engine="chunked", tensor_parallel_size=2)
    runner = two.llm_engine.runner
    runner.workers.stop()
    runner.num_kv_tokens["held"] = 4  # a request the old workers held keys and values for
    with pytest.raises(RuntimeError, match="stopped while requests held KV blocks: abort them first"):
        runner._forward_with_workers(None, None)
    assert not runner.workers.started


def test_minillm_serve_serves_a_split_model_and_stops_its_worker_on_sigterm(tmp_path):
    import httpx

    from tests.test_capacity_endpoint import free_port

    port = free_port()
    command = [sys.executable, "-m", "minillm.cli", "serve", "--model", "tiny", "--port", str(port)]
    proc = subprocess.Popen(command + ["--tensor-parallel-size", "2", "--log-level", "warning"], start_new_session=True)
    try:
        url, deadline, answer = f"http://127.0.0.1:{port}", time.monotonic() + 60, None
        body = {"model": "tiny", "prompt": [5, 9, 2], "max_tokens": 4, "temperature": 0, "return_token_ids": True}
        while answer is None and time.monotonic() < deadline:
            try:
                answer = httpx.post(f"{url}/v1/completions", json=body, timeout=10).json()
            except httpx.TransportError:
                time.sleep(0.3)
        assert answer is not None, "the server did not answer within 60 s"
        expected = LLM("tiny", engine="chunked").generate([[5, 9, 2]], SamplingParams(max_tokens=4))
        assert answer["choices"][0]["token_ids"] == expected[0].token_ids
        # the server's session: the server, multiprocessing's forkserver and the worker it forked (with
        # spawn, where there is no forkserver: a spawn_main child of the server)
        listed = ["ps", "-ww", "-s", str(proc.pid), "-o", "pid=,ppid=,args="]  # -ww: whole command lines
        rows = [
            line.split(None, 2) for line in subprocess.run(listed, capture_output=True, text=True).stdout.splitlines()
        ]
        forkservers = {pid for pid, ppid, args in rows if ppid == str(proc.pid) and "forkserver" in args}
        workers = [pid for pid, ppid, args in rows if ppid in forkservers or "spawn_main" in args]
        assert len(workers) == 1, f"one worker process, got {workers} in {rows}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    deadline = time.monotonic() + 20
    while subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "a process of the server's session is still running"
        time.sleep(0.2)
