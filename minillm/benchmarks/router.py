"""Replicas behind a router, measured: N ``minillm serve`` processes behind SGLang's router
(``sglang-router``, ``round_robin`` and ``cache_aware``), and one replica alone, each measured from
the client with chapter 8's capacity search (``find_capacity`` on ``endpoint_target``: what
``minillm capacity --url ... --prompt-format text`` runs) on a mix whose requests share prefixes.

    python -m minillm.benchmarks.router [--model tiny] [--replicas 2] [--mix "cpu multi-turn chat"]
        [--num-requests 80] [--slo ttft_p95=0.5 --slo itl_p95=0.1] [--json PATH]

Every process starts here on 127.0.0.1 and is stopped before the run ends. The router takes only
text prompts, so the client sends one letter per token id (``prompt_format="text"``); on the tiny
model's byte-level tokenizer a prompt keeps its length. Each replica runs with one thread: on a
2-core machine two replicas, the router and the client share the cores, so the figures are this
machine's, not a GPU server's (chapter 10 simulates those). Results go to
``minillm/benchmarks/results/router_<model>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import torch

from minillm.benchmarks.bench import machine_name
from minillm.benchmarks.served import Log, free_port, process, wait_healthy
from minillm.capacity import endpoint_target, find_capacity

RESULTS = Path(__file__).parent / "results"
POLICIES = ("round_robin", "cache_aware")
MAX_RATE = 200.0  # requests/s: above what this machine serves


@contextmanager
def replica(model: str, args, log: Log):
    port = free_port()
    command = [sys.executable, "-m", "minillm.cli", "serve", "--model", model, "--engine", "chunked"]
    command += ["--max-num-seqs", str(args.max_num_seqs), "--enable-prefix-caching", "--log-level", "warning"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    env = dict(os.environ, MINILLM_NUM_THREADS="1")
    log(" ".join(command))
    with process(command, log, env) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url, timeout=300)
        yield url


@contextmanager
def router(urls: list[str], policy: str, log: Log):
    port = free_port()
    command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--worker-urls", *urls, "--policy", policy, "--log-level", "warn"]
    command += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    log(" ".join(command))
    with process(command, log) as proc:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not answers(url):  # the router registers its workers in the background
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the router at {url} did not come up (exit code {proc.poll()})")
            time.sleep(0.5)
        yield url


def answers(url: str) -> bool:
    body = {"model": "tiny", "prompt": "ab", "max_tokens": 1, "ignore_eos": True}
    try:
        return httpx.post(url + "/v1/completions", json=body, timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def measure(name: str, url: str, args, log: Log) -> dict:
    result = find_capacity(
        "endpoint",
        args.slo,
        target=endpoint_target(url + "/v1", args.model, prompt_format="text"),
        mix=args.mix,
        num_requests=args.num_requests,
        rate_range=(args.low_rate, MAX_RATE),
        progress=lambda r: log(f"  {name}: rate {r.rate:.3g} req/s {'met' if r.met else 'broke'}"),
    )
    return {"setup": name, "capacity": result.to_dict(), "at_low_rate": result.at(args.low_rate).to_dict()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.benchmarks.router", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--mix", default="cpu multi-turn chat")
    parser.add_argument("--num-requests", type=int, default=80, help="requests per rate")
    parser.add_argument("--slo", action="append", default=None, help="default: ttft_p95=0.5 and itl_p95=0.1")
    parser.add_argument("--low-rate", type=float, default=2.0, help="the rate whose latencies are reported too")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    args.slo = args.slo or ["ttft_p95=0.5", "itl_p95=0.1"]
    out = args.json or RESULTS / f"router_{Path(args.model).name}.json"
    log = Log(Path(tempfile.gettempdir()) / f"{out.stem}.log")
    setups = []
    with ExitStack() as stack:
        urls = [stack.enter_context(replica(args.model, args, log)) for _ in range(args.replicas)]
        setups.append(measure("one replica, no router", urls[0], args, log))
        for policy in POLICIES:
            with router(urls, policy, log) as url:
                setups.append(measure(f"{args.replicas} replicas, {policy}", url, args, log))
    report = {
        "model": args.model,
        "replicas": args.replicas,
        "mix": args.mix,
        "num_requests": args.num_requests,
        "slo": args.slo,
        "low_rate": args.low_rate,
        "threads_per_replica": 1,
        "max_num_seqs": args.max_num_seqs,
        "router": "sglang-router " + _version("sglang-router"),
        "machine": machine_name(torch.device("cpu")),
        "date": time.strftime("%Y-%m-%d"),
        "setups": setups,
    }
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    for s in setups:
        print(f"{s['setup']}: capacity {s['capacity']['max_rate']} req/s")
    print(f"wrote {out}")
    return 0


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    raise SystemExit(main())
