"""SmolLM2-135M-Instruct on this CPU: how long ``LLM("smollm2")`` takes to load (the first time, with
the download and the conversion, and from minillm's cache), and how fast each engine decodes.

- ``first_load_s``: a fresh process, an empty cache folder and no pip cache: download, hash checks,
  GGUF conversion, load.
- ``cached_load_s``: a fresh process loading the finished cache (median of ``--repeats``).
- ``engines``: output tokens per second of each engine on ``--requests`` prompts arriving together,
  ``--tokens`` greedy tokens each (EOS ignored), engines interleaved and repeated, medians. Every
  engine's tokens are compared with the naive engine's (``same_tokens_as_naive``).

Writes ``minillm/benchmarks/results/smollm2_cpu.json``. Needs the package index the first time.

    python -m minillm.benchmarks.smollm2_cpu [--requests 8] [--tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from minillm.models.download import CACHE_ENV

RESULTS = Path(__file__).parent / "results" / "smollm2_cpu.json"
ENGINES = ("naive", "static", "continuous", "selective")
PROMPTS = [
    "The capital of France is",
    "A KV cache stores",
    "Write a haiku about GPUs.",
    "Once upon a time",
    "The three primary colours are",
    "To boil an egg,",
    "Python is a language that",
    "The moon orbits",
]


def load_seconds(cache: Path) -> float:
    """Wall seconds of ``LLM("smollm2")`` in a fresh process using ``cache`` (imports not counted)."""
    code = (
        "import time; from minillm import LLM; t = time.perf_counter(); LLM('smollm2'); print(time.perf_counter() - t)"
    )
    env = {**os.environ, CACHE_ENV: str(cache), "PIP_NO_CACHE_DIR": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=900)
    return float(out.stdout.strip().splitlines()[-1])


def engine_rates(cache: Path, num_requests: int, tokens: int, repeats: int) -> dict:
    """Output tok/s per engine (medians over interleaved repeats) and whether its tokens equal naive's."""
    os.environ[CACHE_ENV] = str(cache)
    from minillm.llm import LLM
    from minillm.sampling_params import SamplingParams

    prompts = (PROMPTS * (num_requests // len(PROMPTS) + 1))[:num_requests]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    llms = {e: LLM("smollm2", engine=e, **({} if e == "naive" else {"max_num_seqs": num_requests})) for e in ENGINES}
    rates: dict[str, list[float]] = {e: [] for e in ENGINES}
    tokens_of: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        for engine, llm in llms.items():
            start = time.perf_counter()
            outs = llm.generate(prompts, params)
            rates[engine].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start))
            tokens_of[engine] = [o.token_ids for o in outs]
    return {
        e: {
            "output_tokens_per_s": round(statistics.median(r), 2),
            "same_tokens_as_naive": tokens_of[e] == tokens_of["naive"],
        }
        for e, r in rates.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="minillm-bench-") as tmp:
        cache = Path(tmp)
        first = load_seconds(cache)
        cached = [load_seconds(cache) for _ in range(args.repeats)]
        engines = engine_rates(cache, args.requests, args.tokens, args.repeats)
    report = {
        "benchmark": "smollm2_cpu",
        "model": "smollm2 (SmolLM2-135M-Instruct, float32)",
        "machine": {
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "first_load_s": round(first, 2),
        "cached_load_s": round(statistics.median(cached), 2),
        "requests": args.requests,
        "tokens_per_request": args.tokens,
        "repeats": args.repeats,
        "engines": engines,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"first load (download + conversion): {first:.1f} s; cached load: {statistics.median(cached):.1f} s")
    for engine, row in engines.items():
        print(
            f"{engine:<11} {row['output_tokens_per_s']:>7.1f} output tok/s   same tokens as naive: "
            f"{row['same_tokens_as_naive']}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
