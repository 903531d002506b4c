"""How fast the simulator replays a workload: 10,000 support-chat-like requests per engine.

Widgets re-run the simulator while a learner drags a slider, so a replay should take about a
second. Writes benchmarks/results/sim_speed.json.

    python benchmarks/sim_speed.py [--num-requests 10000] [--profile h200-qwen3-0.6b]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from minillm import workloads as w
from minillm.engines import BUILDERS, ENGINE_OPTIONS
from minillm.sim import simulate


def support_chat(num_requests: int, rate: float, seed: int = 0) -> w.Workload:
    """Prompts of a few hundred tokens (a system prompt plus a question), mostly short answers with
    some long ones, Poisson arrivals."""
    return w.random_workload(
        num_requests,
        prompt_lens=w.lognormal(median=220, sigma=0.4, low=64, high=1024),
        output_lens=w.mixture((0.7, w.lognormal(median=40, sigma=0.6, low=4, high=256)),
                              (0.3, w.lognormal(median=250, sigma=0.5, low=64, high=1024))),
        rate=rate,
        seed=seed,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=20.0, help="arrivals per simulated second")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="for the engines that batch")
    parser.add_argument("--profile", default="h200-qwen3-0.6b")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "sim_speed.json"))
    args = parser.parse_args()

    workload = support_chat(args.num_requests, args.rate)
    results = []
    for engine in BUILDERS:
        options = {"max_num_seqs": args.max_num_seqs} if "max_num_seqs" in ENGINE_OPTIONS[engine] else {}
        start, start_cpu = time.perf_counter(), time.process_time()
        result = simulate(engine, workload, args.profile, **options)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
        row = {
            "engine": engine,
            "options": options,
            "wall_seconds": round(seconds, 3),
            "cpu_seconds": round(cpu_seconds, 3),  # this process only: less disturbed by other jobs
            "engine_steps": len(result.trace),
            "steps_per_second": round(len(result.trace) / seconds),
            "request_steps_per_second": round(sum(len(s.num_scheduled_tokens) for s in result.trace) / seconds),
            "simulated_seconds": round(result.summary["duration_seconds"], 1),
        }
        results.append(row)
        print(json.dumps(row))
    report = {
        "what": "seconds to simulate the workload once per engine (simulate(): building requests, the run, the summary)",
        "machine": f"{platform.machine()} {platform.processor()}, Python {platform.python_version()}",
        "load_average_1min": round(os.getloadavg()[0], 2),  # other jobs on the machine slow the wall clock
        "num_requests": args.num_requests,
        "prompt_tokens": workload.num_prompt_tokens,
        "output_tokens": workload.num_output_tokens,
        "rate_per_second": args.rate,
        "profile": args.profile,
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
