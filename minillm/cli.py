"""The ``minillm`` command: ``demo`` (headless main demo), ``grade`` (score the exercises),
``make-exercises`` (regenerate exercises/ from solutions/)."""

from __future__ import annotations

import argparse
import sys

from minillm.course.exercises import main as make_exercises
from minillm.course.grading import main as grade


def demo(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="minillm demo", description="Run an engine (naive by default) on a few prompts and print per-request latencies.")
    parser.add_argument("--model", default="tiny", help="'tiny' (offline, built in), a hub name or a local path")
    parser.add_argument("--engine", default="naive", help="the engine to run (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)

    from minillm import LLM, SamplingParams
    from minillm.metrics import request_table, summarize, summary_table
    from minillm.workloads import DEMO_PROMPTS

    llm = LLM(args.model, engine=args.engine, device=args.device)
    print(f"model={args.model} engine={args.engine} device={llm.device} dtype={llm.dtype}")
    outputs = llm.generate(DEMO_PROMPTS, SamplingParams(max_tokens=args.max_tokens))
    print(request_table(outputs))
    print()
    print(summary_table(summarize(outputs, llm.trace)))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"demo": demo, "grade": grade, "make-exercises": make_exercises}
    if not argv or argv[0] not in commands:
        print(f"usage: minillm {{{','.join(commands)}}} [options]", file=sys.stderr)
        return 2
    try:
        return commands[argv[0]](argv[1:])
    except (ValueError, NotImplementedError) as err:  # bad input: the message says what to change
        print(f"minillm {argv[0]}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
