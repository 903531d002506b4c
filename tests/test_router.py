"""Replicas behind SGLang's router (chapter 10): two minillm servers (the tiny model, in threads, on
loopback) behind ``sglang-router`` (its own launcher, a subprocess on loopback, stopped by the test).
The router forwards minillm's ``/v1/completions``, keeps prompts that share a prefix on one replica
under ``cache_aware``, alternates under ``round_robin``, and the capacity tool measures through it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import httpx
import pytest

from minillm.capacity import at_rate, base_workload, endpoint_target
from minillm.server import serve_in_thread
from tests.test_capacity_endpoint import free_port

pytestmark = pytest.mark.timeout(180)

OPTIONS = {"engine": "chunked", "max_num_seqs": 8, "enable_prefix_caching": True}


@pytest.fixture(scope="module")
def replicas():
    with serve_in_thread("tiny", **OPTIONS) as a, serve_in_thread("tiny", **OPTIONS) as b:
        yield [a, b]


@contextlib.contextmanager
def router(replicas, policy: str):
    port = free_port()
    command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--worker-urls", *[r.url for r in replicas], "--policy", policy, "--log-level", "warn"]
    command += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not ready(url):  # the workers register in the background after the router starts
            assert proc.poll() is None, f"the router exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the router did not register both workers within 60 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def ready(url: str) -> bool:
    try:
        return complete(url, "ab", 1).status_code == 200
    except httpx.HTTPError:
        return False


def complete(url: str, prompt: str, max_tokens: int) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30)


def served(replicas) -> list[int]:
    return [len(r.outputs()) for r in replicas]


def where(replicas, url: str, prompt: str) -> int:
    """The replica that served ``prompt``, sent through the router at ``url``."""
    before = served(replicas)
    response = complete(url, prompt, 4)
    assert response.status_code == 200, response.text
    (replica,) = [i for i, (b, a) in enumerate(zip(before, served(replicas))) if a == b + 1]
    return replica


def test_cache_aware_keeps_a_shared_prefix_on_one_replica_and_round_robin_alternates(replicas):
    prefixes = {"x": "x" * 300, "y": "y" * 300}
    with router(replicas, "cache_aware") as url:
        for name, prefix in prefixes.items():
            chosen = {where(replicas, url, prefix + str(i)) for i in range(4)}
            assert len(chosen) == 1, f"prompts sharing prefix {name!r} went to replicas {chosen}"
    with router(replicas, "round_robin") as url:
        chosen = [where(replicas, url, prefixes["x"] + str(i)) for i in range(4)]
        assert sorted(chosen) == [0, 0, 1, 1], chosen


def test_the_capacity_tool_measures_through_the_router_with_text_prompts(replicas):
    work = at_rate(base_workload("cpu chat", 8, seed=3), 20.0)
    with router(replicas, "cache_aware") as url:
        run = endpoint_target(url + "/v1", "tiny", prompt_format="text")(work)
    assert [len(r.itl) + 1 for r in run.requests] == [p.max_tokens for p in work.sampling_params]
    assert all(r.ttft > 0 for r in run.requests)


def test_an_unknown_prompt_format_is_refused_by_name_before_anything_is_sent():
    with pytest.raises(ValueError, match="prompt_format must be one of token_ids, text, got 'letters'"):
        endpoint_target("http://127.0.0.1:9/v1", "tiny", prompt_format="letters")


def test_the_cli_refuses_prompt_format_without_url(capsys):
    from minillm.cli import main

    assert main(["capacity", "--slo", "ttft_p95=0.5", "--prompt-format", "text"]) == 2
    assert "--api-key, --max-concurrency and --prompt-format go with --url" in capsys.readouterr().err
