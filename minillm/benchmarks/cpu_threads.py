"""How many CPU threads should torch use for the course's models? Thread count vs step time, with
the machine quiet and with one core kept busy by another process.

This is the measurement behind ``minillm.models.cpu_threads``. Each configuration runs in a fresh process
(torch's thread pool is per process); every repeat runs every configuration, quiet and busy, thread
counts in turn, so drift in the machine hits all of them alike; each figure is the median over the
repeats of the engine's median step time:

- ``decode_1`` / ``decode_4`` / ``decode_32``: one decode step with 1, 4 or 32 running requests (the
  selective engine; 32 is ``minillm bench``'s CPU batch);
- ``prefill_2048``: one step that prefills 8 prompts of 256 tokens together.

The busy core is a plain Python loop in another process, as a browser tab or a second kernel
would be. Writes ``minillm/benchmarks/results/cpu_threads.json``.

    python -m minillm.benchmarks.cpu_threads [--model tiny] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "cpu_threads.json"
CONDITIONS = ("quiet", "one core busy")


def busy_core(seconds: float) -> subprocess.Popen:
    """Another process that keeps one core busy for at most ``seconds`` (then it stops by itself),
    as a browser tab or a second kernel would. The notebook test uses it too."""
    loop = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", loop])


def measure(model: str, num_threads: int) -> dict:
    """Median step times (ms) of one fresh ``LLM`` run with ``num_threads`` threads."""
    from minillm.llm import LLM
    from minillm.sampling_params import SamplingParams

    llm = LLM(model, engine="selective", max_num_seqs=32, num_threads=num_threads)
    ms = {}
    for name, prompts, tokens in (
        ("decode_1", [[1] * 8], 64),
        ("decode_4", [[1] * 8] * 4, 64),
        ("decode_32", [[1] * 8] * 32, 32),
    ):
        llm.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))
        decodes = [s.duration for s in llm.trace if not s.prefill_ids]
        ms[name] = statistics.median(decodes) * 1e3
    llm.generate([[1] * 256] * 8, SamplingParams(max_tokens=1, ignore_eos=True))
    ms["prefill_2048"] = llm.trace[0].duration * 1e3
    return ms


def run_in_subprocess(model: str, num_threads: int) -> dict:
    code = (
        "import json; from minillm.benchmarks.cpu_threads import measure; "
        f"print(json.dumps(measure({model!r}, {num_threads})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="default: results/cpu_threads.json, cpu_threads_MODEL.json")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = RESULTS if args.model == "tiny" else RESULTS.with_name(f"cpu_threads_{args.model}.json")

    thread_counts = sorted({1, 2, os.cpu_count() or 2})
    runs: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.repeats):
        for condition in CONDITIONS:
            busy = busy_core(600) if condition != "quiet" else None
            try:
                time.sleep(0.5)
                for n in thread_counts:
                    runs.setdefault((condition, n), []).append(run_in_subprocess(args.model, n))
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
    rows = []
    for (condition, n), samples in runs.items():  # in the order of the first repeat
        rows.append(
            {
                "condition": condition,
                "num_threads": n,
                **{k: round(statistics.median(s[k] for s in samples), 3) for k in samples[0]},
            }
        )
    report = {
        "benchmark": "cpu_threads",
        "model": args.model,
        "repeats": args.repeats,
        "unit": "ms per step (median)",
        "machine": {
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{'condition':<14} {'threads':>7} {'decode_1':>9} {'decode_4':>9} {'decode_32':>9} {'prefill_2048':>13}  (ms)"
    )
    for r in rows:
        print(
            f"{r['condition']:<14} {r['num_threads']:>7} {r['decode_1']:>9.2f} {r['decode_4']:>9.2f} "
            f"{r['decode_32']:>9.2f} {r['prefill_2048']:>13.1f}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
