"""Prefix caching off vs on: time to first token, prefill tokens computed and hit rate on traffic that
repeats itself, on this CPU and on the simulated H200; what eviction costs; the capacity it buys.

- Three workloads, each at a CPU scale and an H200 scale, Poisson arrivals: a shared system prompt
  (``workloads.shared_prefix``), a few-shot prompt (a longer shared prefix of examples, short
  questions, answers of a few tokens) and a multi-turn chat (``workloads.multi_turn``: each turn
  resends the chat so far).
- ``cpu``: the tiny model, ``engine="chunked"``, caching off and on: two ``LLM``s on one loaded
  model, so the same threads. Every repeat runs each workload off and on back to back (which goes
  first alternates), each run starting cold (``reset_prefix_cache``); figures are the medians over
  the repeats.
- ``simulated``: the same on the simulator (profile h200-qwen3-0.6b), one run each (deterministic).
- ``eviction``: the multi-turn chat with a KV pool too small to keep a chat's earlier turns until
  its next one: other chats' blocks evict them, so the hit rate and the TTFT gain fall.
- ``capacity``: ``find_capacity`` off vs on for the capacity mixes that repeat themselves, simulated.

Prefill tokens computed are counted from the trace (recomputation after a preemption included); the
hit rate is the prompt tokens found cached over all prompt tokens. Writes
``OUT/prefix_caching_cpu.json`` (``OUT`` defaults to minillm/benchmarks/results).

    python -m minillm.benchmarks.prefix_caching [--out DIR] [--repeats 3] [--small]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from minillm import workloads as w
from minillm.capacity import find_capacity
from minillm.llm import LLM
from minillm.metrics import percentiles
from minillm.sim import simulate

RESULTS = Path(__file__).parent / "results"
PROFILE = "h200-qwen3-0.6b"
SLOS = ["ttft_p95=0.5", "itl_p95=0.05"]
CPU_OPTIONS = {"max_num_seqs": 16}  # the default pool: 512 blocks of 16 tokens
SIM_OPTIONS = {"max_num_seqs": 64, "num_gpu_blocks": 16384}  # 262,144 tokens of KV, 30 GB for Qwen3-0.6B
# A pool that holds a few requests but not every chat's history between its turns.
SMALL_POOL = {"cpu": {"num_gpu_blocks": 48}, "simulated": {"num_gpu_blocks": 1024}}
CAPACITY_MIXES = ("chat + system prompt", "multi-turn chat")


def make_workloads(scale: str, num_requests: int) -> dict[str, w.Workload]:
    """The three workloads at ``"cpu"`` scale (the tiny model's 2,048 positions, seconds of real time)
    or ``"simulated"`` scale (Qwen3-0.6B on an H200)."""
    u = w.uniform
    if scale == "cpu":
        return {
            "shared system prompt": w.shared_prefix(num_requests, 512, u(16, 64), u(8, 16), rate=4.0),
            "few-shot prompt": w.shared_prefix(num_requests, 1024, u(8, 16), u(1, 4), rate=3.0),
            "multi-turn chat": w.multi_turn(num_requests // 4, 4, u(64, 128), u(16, 32), rate=2.0, think_time=0.5),
        }
    return {
        "shared system prompt": w.shared_prefix(num_requests, 1000, u(32, 256), u(16, 128), rate=40.0),
        "few-shot prompt": w.shared_prefix(num_requests, 3000, u(16, 64), u(1, 8), rate=40.0),
        "multi-turn chat": w.multi_turn(num_requests // 4, 4, u(32, 256), u(16, 128), rate=10.0, think_time=10.0),
    }


def run_figures(outputs, trace) -> dict:
    """What one run of a workload measured."""
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    ttft = percentiles([o.metrics.ttft for o in outputs], (50, 95))
    return {
        "ttft_p50_s": ttft["p50"],
        "ttft_p95_s": ttft["p95"],
        "prompt_tokens": prompt_tokens,
        "prefill_tokens_computed": sum(s.num_scheduled_tokens[r] for s in trace for r in s.prefill_ids),
        "hit_rate": sum(o.num_cached_tokens for o in outputs) / prompt_tokens,
    }


def medians(runs: list[dict]) -> dict:
    """Each figure's median over the repeats."""
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def off_vs_on(off: dict, on: dict) -> dict:
    return {"off": off, "on": on, "ttft_p50_speedup": off["ttft_p50_s"] / on["ttft_p50_s"]}


def cpu_runs(workloads: dict, repeats: int, num_threads: int | None, small_pool: dict | None = None) -> dict:
    """Each workload off and on with the tiny model, interleaved, medians over ``repeats``."""
    options = {**CPU_OPTIONS, **(small_pool or {})}
    off = LLM("tiny", engine="chunked", num_threads=num_threads, **options)
    llms = {"off": off, "on": LLM(off, engine="chunked", enable_prefix_caching=True, **options)}
    runs = {name: {"off": [], "on": []} for name in workloads}
    same_tokens = dict.fromkeys(workloads, True)
    for repeat in range(repeats):
        for name, workload in workloads.items():
            tokens = {}
            for caching in ("off", "on") if repeat % 2 == 0 else ("on", "off"):
                llm = llms[caching]
                llm.reset_prefix_cache()  # every run starts cold
                outputs = llm.generate(workload.prompts, workload.sampling_params, workload.arrival_times)
                runs[name][caching].append(run_figures(outputs, llm.trace))
                tokens[caching] = [o.token_ids for o in outputs]
            same_tokens[name] &= tokens["off"] == tokens["on"]
    return {
        name: {**off_vs_on(medians(r["off"]), medians(r["on"])), "same_tokens": same_tokens[name]}
        for name, r in runs.items()
    }


def simulated_runs(workloads: dict, small_pool: dict | None = None) -> dict:
    """Each workload off and on, simulated once (the simulator is deterministic)."""
    options = {**SIM_OPTIONS, **(small_pool or {})}
    figures = {}
    for name, workload in workloads.items():
        off, on = (
            simulate("chunked", workload, PROFILE, enable_prefix_caching=caching, **options)
            for caching in (False, True)
        )
        figures[name] = off_vs_on(run_figures(off.outputs, off.trace), run_figures(on.outputs, on.trace))
    return figures


def capacity(num_requests: int) -> dict:
    """The simulated H200's capacity (req/s) under ``SLOS``, off vs on, for each mix in ``CAPACITY_MIXES``."""
    rates = {}
    for mix in CAPACITY_MIXES:
        off, on = (
            find_capacity(
                "chunked", SLOS, mix=mix, num_requests=num_requests, enable_prefix_caching=caching, **SIM_OPTIONS
            )
            for caching in (False, True)
        )
        rates[mix] = {"off": off.max_rate, "on": on.max_rate, "ratio": on.max_rate / off.max_rate}
    return rates


def benchmark(repeats: int = 3, small: bool = False, num_threads: int | None = None) -> dict:
    """The whole report; ``small=True`` runs a few requests of each, for tests."""
    cpu_n, sim_n, capacity_n = (4, 40, 60) if small else (12, 400, 300)
    cpu_workloads, sim_workloads = make_workloads("cpu", cpu_n), make_workloads("simulated", sim_n)
    load_before = os.getloadavg()
    start = time.perf_counter()
    report = {
        "what": "prefix caching off vs on (chunked engine): TTFT p50/p95, prefill tokens computed, hit rate",
        "machine": f"{platform.machine()} ({os.cpu_count()} CPUs), Python {platform.python_version()}",
        "small": small,
        "workloads": {
            scale: {
                name: {
                    "requests": len(wl),
                    "prompt_tokens": wl.num_prompt_tokens,
                    "repeated_tokens": w.repeated_tokens(wl),
                }
                for name, wl in workloads.items()
            }
            for scale, workloads in (("cpu", cpu_workloads), ("simulated", sim_workloads))
        },
        "cpu": {
            "model": "tiny",
            "options": CPU_OPTIONS,
            "repeats": repeats,
            "results": cpu_runs(cpu_workloads, repeats, num_threads),
        },
        "simulated": {"profile": PROFILE, "options": SIM_OPTIONS, "results": simulated_runs(sim_workloads)},
        "eviction": {
            "workload": "multi-turn chat",
            "small_pool": SMALL_POOL,
            "cpu": cpu_runs(
                {"multi-turn chat": cpu_workloads["multi-turn chat"]}, repeats, num_threads, SMALL_POOL["cpu"]
            ),
            "simulated": simulated_runs({"multi-turn chat": sim_workloads["multi-turn chat"]}, SMALL_POOL["simulated"]),
        },
        "capacity": {
            "profile": PROFILE,
            "options": SIM_OPTIONS,
            "slo": SLOS,
            "num_requests": capacity_n,
            "max_rate": capacity(capacity_n),
        },
    }
    report["seconds"] = round(time.perf_counter() - start, 1)
    report["load_average_1min"] = {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS), help="the folder for prefix_caching_cpu.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-threads", type=int, default=None, help="torch threads (default: minillm's choice)")
    parser.add_argument("--small", action="store_true", help="a few requests of each: seconds, for tests")
    args = parser.parse_args()
    report = benchmark(args.repeats, args.small, args.num_threads)
    out = Path(args.out) / "prefix_caching_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out} ({report['seconds']} s)")


if __name__ == "__main__":
    main()
