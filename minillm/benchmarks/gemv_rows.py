"""Up to how many rows should the fast path's matmuls take the ``cpu_gemv`` loop? The loop against
oneDNN's prepacked kernel, on a step's matmuls of a real model.

This is the measurement behind ``GEMV_MAX_ROWS`` in ``minillm.models.fast_model``. For each row count
(the tokens of a step), one "step" is every matmul of the model's fast path in the engine's order:
each layer's fused q/k/v, o, fused gate/up and down projections, then the LM head; every layer has
weights of its own, so each call finds its weights cold, as in the engine. Both ways run the very
``Linear`` objects the engine uses, with the loop switched off for oneDNN's turn. Row counts and the
two ways take turns in every repeat, so drift in the machine hits all of them alike; each figure is
the median over the repeats. Writes ``results/gemv_rows_<model>_<cpu>.json``.

    python -m minillm.benchmarks.gemv_rows [--model smollm2] [--repeats 7] [--num-threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from minillm.benchmarks.bench import RESULTS, machine_name
from minillm.models.cpu_threads import resolve_num_threads
from minillm.models.fast_model import FastCausalLM, fast_path_steps
from minillm.models.loader import load_model

ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
WAYS = ("cpu_gemv", "prepacked")


def step_linears(model: FastCausalLM) -> list:
    """Every matmul of one step, in the order the forward calls them."""
    per_layer = [[*layer.qkv, layer.o_proj, *layer.gate_up, layer.down_proj] for layer in model.layers]
    return [linear for layer in per_layer for linear in layer] + [model.lm_head]


@torch.inference_mode()
def time_step(linears: list, rows: int, way: str) -> float:
    """Seconds for one pass over ``linears`` with ``rows`` rows, the loop on (``cpu_gemv``) or off."""
    limit = rows if way == "cpu_gemv" else 0
    for linear in linears:
        linear.gemv_max_rows = limit
    widths = [linear.packed.size(1) for linear in linears]  # each matmul's input features
    inputs = {k: torch.randn(rows, k) for k in set(widths)}  # the hidden size's and the MLP's, made off the clock
    start = time.perf_counter()
    for linear, k in zip(linears, widths):
        linear(inputs[k])
    return time.perf_counter() - start


def measure(model_name: str, repeats: int) -> dict:
    model, _ = load_model(model_name, torch.float32, torch.device("cpu"))
    steps = fast_path_steps(["fused", "prepacked", "cpu_gemv"], torch.device("cpu"), torch.float32)
    if set(steps) != {"fused", "prepacked", "cpu_gemv"}:
        raise SystemExit(f"this CPU can take only {steps} of fused, prepacked and cpu_gemv: nothing to compare")
    linears = step_linears(FastCausalLM(model, steps))
    for rows in ROWS:  # a warm-up pass of each, not timed
        for way in WAYS:
            time_step(linears, rows, way)
    times = {(rows, way): [] for rows in ROWS for way in WAYS}
    for r in range(repeats):
        for rows in ROWS:
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                times[rows, way].append(time_step(linears, rows, way))
    return {str(rows): {way: statistics.median(times[rows, way]) * 1e3 for way in WAYS} for rows in ROWS}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--num-threads", type=int, default=None)
    args = parser.parse_args(argv)
    threads = resolve_num_threads(args.model, args.num_threads, dedicated=True)
    torch.set_num_threads(threads)
    ms = measure(args.model, args.repeats)
    up_to = 0  # the largest row count up to which the loop won at every count measured
    for rows in ROWS:
        if ms[str(rows)]["cpu_gemv"] >= ms[str(rows)]["prepacked"]:
            break
        up_to = rows
    report = {
        "what": "one step's matmuls (fused q/k/v, o, fused gate/up, down per layer, then the LM head), ms",
        "model": args.model,
        "machine": machine_name(torch.device("cpu")),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": threads,
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "step_ms": ms,
        "loop_wins_up_to_rows": up_to,
    }
    out = RESULTS / f"gemv_rows_{args.model}_{report['cpu_capability'].lower()}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{args.model} on {report['machine']}, {threads} threads, medians of {args.repeats} repeats (ms per step)")
    print(f"{'rows':>5} {'cpu_gemv':>9} {'prepacked':>10}")
    for rows, t in ms.items():
        print(f"{rows:>5} {t['cpu_gemv']:>9.1f} {t['prepacked']:>10.1f}")
    print(f"the loop won at every row count up to {up_to}; wrote {out}")


if __name__ == "__main__":
    main()
