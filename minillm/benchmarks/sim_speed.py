"""How fast the simulator replays 10,000 requests, per engine, on two workloads.

Widgets re-run the simulator while a learner drags a slider, so a replay of 10,000 requests should
take under a second. The cost grows with engine steps and with (request, step) pairs -- one per
generated token, though stretches of identical decode steps are fast-forwarded
(``minillm.sim.fast_forward``) -- so the benchmark runs two workloads:

- ``mix``: the widgets' "support chat" length mix (``workloads.mix_workload``), about 30 output
  tokens per request, arriving faster than any engine serves them (the engine is always busy);
- ``long``: long answers (a few hundred prompt tokens, 70% short and 30% long answers, about 120
  output tokens per request) at 20 arrivals per second.

Times are CPU seconds of this process (``time.process_time``), the fastest of ``--repeats`` runs:
on a shared machine the wall clock mostly measures the other jobs. Writes
minillm/benchmarks/results/sim_speed.json.

    python -m minillm.benchmarks.sim_speed [--num-requests 10000] [--repeats 3] [--no-memory]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time
import tracemalloc
from pathlib import Path

from minillm import workloads as w
from minillm.engines import BUILDERS, ENGINE_OPTIONS
from minillm.sim import simulate

MIX = "support chat: short answers + long summaries"


def long_answers(num_requests: int, rate: float, seed: int = 0) -> w.Workload:
    """Prompts of a few hundred tokens (a system prompt plus a question), mostly short answers with
    some long ones, Poisson arrivals."""
    return w.random_workload(
        num_requests,
        prompt_lens=w.lognormal(median=220, sigma=0.4, low=64, high=1024),
        output_lens=w.mixture(
            (0.7, w.lognormal(median=40, sigma=0.6, low=4, high=256)),
            (0.3, w.lognormal(median=250, sigma=0.5, low=64, high=1024)),
        ),
        rate=rate,
        seed=seed,
    )


def cpu_seconds(
    engine: str, workload: w.Workload, profile: str, options: dict, repeats: int
) -> tuple[list[float], object]:
    """CPU seconds of each of ``repeats`` ``simulate`` calls, and the last result."""
    times = []
    for _ in range(repeats):
        result = None
        gc.collect()  # the previous run's garbage is not this run's cost
        start = time.process_time()
        result = simulate(engine, workload, profile, **options)
        times.append(time.process_time() - start)
    return times, result


def trace_mib(engine: str, workload: w.Workload, profile: str, options: dict) -> dict:
    """Memory of one run, by tracemalloc (which slows the run: timed separately): the peak while
    simulating, and what the trace alone holds afterwards."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    result = simulate(engine, workload, profile, **options)
    peak = tracemalloc.get_traced_memory()[1]
    trace, result = result.trace, None
    gc.collect()
    with_trace = tracemalloc.get_traced_memory()[0]
    trace = None  # noqa: F841 -- dropping it frees the trace
    without_trace = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"peak_mib": round((peak - base) / 2**20, 1), "trace_mib": round((with_trace - without_trace) / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument(
        "--mix-rate",
        type=float,
        default=500.0,
        help="arrivals per simulated second of the mix: above every engine's capacity at max_num_seqs=64",
    )
    parser.add_argument(
        "--long-rate", type=float, default=20.0, help="arrivals per simulated second of the long workload"
    )
    parser.add_argument("--max-num-seqs", type=int, default=64, help="for the engines that batch")
    parser.add_argument("--profile", default="h200-qwen3-0.6b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true", help="skip the (slower) tracemalloc run per case")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "sim_speed.json"))
    args = parser.parse_args()

    workloads = {
        "mix": (
            w.mix_workload(MIX, args.num_requests, args.mix_rate),
            args.mix_rate,
            f"workloads.mix_workload({MIX!r}): the widgets' default length mix",
        ),
        "long": (
            long_answers(args.num_requests, args.long_rate),
            args.long_rate,
            "long answers: prompts ~220 tokens, 70% answers ~40 tokens, 30% ~250 tokens",
        ),
    }
    simulate("continuous", w.mix_workload(MIX, 20, 10.0), args.profile)  # builds the weightless model once, untimed
    load_before = os.getloadavg()
    report = {
        "what": "CPU seconds to simulate the workload once per engine (simulate(): building requests, the run, "
        "the summary); the fastest of the repeats",
        "goal": "10,000 requests in under a second, so widgets can re-run the simulator live",
        "machine": f"{platform.machine()} {platform.processor()} ({os.cpu_count()} CPUs), Python "
        "{platform.python_version()}",
        "profile": args.profile,
        "num_requests": args.num_requests,
        "workloads": {},
        "results": [],
    }
    for name, (workload, rate, description) in workloads.items():
        report["workloads"][name] = {
            "description": description,
            "rate_per_second": rate,
            "prompt_tokens": workload.num_prompt_tokens,
            "output_tokens": workload.num_output_tokens,
        }
        for engine in BUILDERS:
            options = {"max_num_seqs": args.max_num_seqs} if "max_num_seqs" in ENGINE_OPTIONS[engine] else {}
            times, result = cpu_seconds(engine, workload, args.profile, options, args.repeats)
            best = min(times)
            request_steps = sum(len(s.num_scheduled_tokens) for s in result.trace)
            row = {
                "workload": name,
                "engine": engine,
                "options": options,
                "cpu_seconds": round(best, 3),
                "cpu_seconds_all": [round(t, 3) for t in times],
                "under_one_second": best < 1.0,
                "engine_steps": len(result.trace),
                "request_steps": request_steps,  # (request, step) pairs: the per-request work of the loop
                "us_per_step": round(best / len(result.trace) * 1e6, 2),
                "us_per_request_step": round(best / request_steps * 1e6, 2),
                "simulated_seconds": round(result.summary["duration_seconds"], 1),
                "mean_running": round(result.summary["num_requests_running"]["mean"], 1),
                "mean_waiting": round(result.summary["num_requests_waiting"]["mean"], 1),
            }
            result = None
            if not args.no_memory:
                row.update(trace_mib(engine, workload, args.profile, options))
            report["results"].append(row)
            print(json.dumps(row), flush=True)
    report["load_average_1min"] = {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
