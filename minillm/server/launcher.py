"""Starting and stopping a server: ``minillm serve`` (blocking, for a terminal) and
``serve_in_thread`` (in the background, for tests and notebooks).

    from minillm.server import serve_in_thread
    with serve_in_thread("tiny", engine="chunked", max_num_seqs=8) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        ...
        server.trace          # the engine's live trace: draw it with minillm.widgets

Both bind 127.0.0.1 unless told otherwise: a server on every interface is open to the network.

Stopping (Ctrl-C, SIGTERM, ``Server.stop``) drains: the server takes no new requests, gives the ones
under way ``shutdown_timeout`` seconds to finish, ends any still running with an error event and
``[DONE]``, and returns; ``minillm serve`` then exits 0.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import fields

import uvicorn

from minillm.models import cpu_threads
from minillm.request import RequestOutput
from minillm.server.api_server import build_app
from minillm.server.async_llm import DEFAULT_MAX_TRACE_STEPS, AsyncLLM
from minillm.server.limits import ServerLimits
from minillm.server.prometheus import ServerMetrics

DEFAULT_HOST = "127.0.0.1"
DEFAULT_SHUTDOWN_TIMEOUT = 10.0  # seconds the requests under way get to finish when the server stops
FLUSH_S = 2.0  # after that, what uvicorn gives the last events to reach their clients


class DrainingUvicorn(uvicorn.Server):
    """uvicorn's server, which drains minillm's engine (``AsyncLLM.drain``) as it starts to shut down,
    before it waits for the connections to close."""

    def __init__(self, config: uvicorn.Config, drain):
        super().__init__(config)
        self.drain = drain

    async def shutdown(self, sockets=None) -> None:
        self.drain()
        await super().shutdown(sockets)


class Server:
    """A running server: an ``AsyncLLM`` (the engine thread) behind a uvicorn server. ``start()``
    runs uvicorn in a thread of its own; ``run()`` in the calling one (the CLI)."""

    def __init__(
        self,
        llm,
        model_name: str | None = None,
        host: str = DEFAULT_HOST,
        port: int = 8000,
        api_key: str | None = None,
        max_waiting: int | None = None,
        max_trace_steps: int = DEFAULT_MAX_TRACE_STEPS,
        log_level: str = "warning",
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        limits: ServerLimits | None = None,
    ):
        check_shutdown_timeout(shutdown_timeout)
        limits = limits or ServerLimits()
        self.llm = llm
        self.model_name = model_name or "minillm"
        self.metrics = ServerMetrics(self.model_name)
        self.async_llm = AsyncLLM(llm, self.metrics, max_trace_steps)
        try:
            self.app = build_app(self.async_llm, self.model_name, self.metrics, api_key, max_waiting)
        except BaseException:
            self.async_llm.shutdown()
            raise
        # The server's event loop runs the handlers; the engine runs in its own thread.
        config = uvicorn.Config(
            self.app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=shutdown_timeout + FLUSH_S,
            **limits.uvicorn_options(),
        )
        self.uvicorn = DrainingUvicorn(config, drain=lambda: self.async_llm.drain(shutdown_timeout))
        self.shutdown_timeout = shutdown_timeout
        self.host = host
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port bound (the free one the system chose, for ``port=0``)."""
        return self.uvicorn.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def trace(self):
        """The engine's live ``Trace``: one row per step since the server started."""
        return self.async_llm.trace

    def outputs(self) -> list[RequestOutput]:
        """Every request the server accepted (the latest 10,000) as ``RequestOutput``s, finished or
        not, with their metrics: ``draw_slots(server.trace, server.outputs())`` draws the live
        slots view, and ``minillm.metrics.summarize(server.outputs())`` its latencies once all
        have finished."""
        tokenizer = self.llm.tokenizer
        outputs = []
        for r in self.async_llm.requests():
            ids = list(r.output_token_ids)
            outputs.append(
                RequestOutput(
                    r.request_id,
                    r.prompt_token_ids,
                    ids,
                    tokenizer.decode(ids) if tokenizer else "",
                    r.finish_reason,
                    r.metrics,
                    r.num_cached_tokens or 0,
                )
            )
        return outputs

    def stats(self) -> dict:
        """The KV pool now (as ``LLM.stats``): blocks free and in use, preemptions."""
        engine = self.async_llm.engine
        return {
            "engine": self.llm.engine_name,
            "num_steps": engine.num_steps,
            "num_unfinished_requests": self.async_llm.num_unfinished(),
            **engine.scheduler.stats(),
        }

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C or SIGTERM), then stop the engine thread."""
        try:
            self.uvicorn.run()
        finally:
            self.async_llm.shutdown()

    def start(self, timeout: float = 30.0) -> Server:
        """Serve from a background thread; returns once the port is bound."""
        self._thread = threading.Thread(target=self.uvicorn.run, name="minillm-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start on {self.host}:{self.uvicorn.config.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving: drain (see the module docstring), then stop the engine thread."""
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(self.shutdown_timeout + 2 * FLUSH_S)
        self.async_llm.shutdown()


def check_shutdown_timeout(seconds) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise ValueError(f"shutdown_timeout must be a number of seconds >= 0, got {seconds!r}")


@contextmanager
def serve_in_thread(
    llm_or_model="tiny",
    port: int = 0,
    host: str = DEFAULT_HOST,
    api_key: str | None = None,
    max_waiting: int | None = None,
    model_name: str | None = None,
    shutdown_timeout: float = 2.0,
    **llm_options,
):
    """Serve an ``LLM`` (or a model name, loaded here with ``llm_options`` such as ``engine=`` and
    engine options) on ``host:port`` (``port=0``: a free one) for the ``with`` block; yields the
    ``Server`` (``.url``, ``.trace``, ``.outputs()``, ``.stats()``) and stops it cleanly afterwards,
    giving requests still under way ``shutdown_timeout`` seconds. Clients send ``model_name`` as
    ``model``: by default the model name given, or "minillm" for an ``LLM`` (which does not keep
    its name). The server steps the ``LLM``'s own engine: offline calls on it wait for the block to end."""
    from minillm.llm import LLM

    if isinstance(llm_or_model, LLM):
        if llm_options:
            raise ValueError(f"options {sorted(llm_options)} go with a model name, not an LLM that is already built")
        llm, name = llm_or_model, model_name
    else:
        llm, name = LLM(llm_or_model, **llm_options), model_name or str(llm_or_model)
    server = Server(llm, name, host, port, api_key, max_waiting, shutdown_timeout=shutdown_timeout).start()
    try:
        yield server
    finally:
        server.stop()


# --- minillm serve ------------------------------------------------------------------------------
ENGINE_FLAGS = (  # (flag, type): every engine option, vLLM's spelling; only the ones given are passed
    ("--max-num-seqs", int),
    ("--max-num-batched-tokens", int),
    ("--long-prefill-token-threshold", int),
    ("--block-size", int),
    ("--num-gpu-blocks", int),
    ("--kv-cache-memory-bytes", int),
    ("--gpu-memory-utilization", float),
    ("--preemption-mode", str),
    ("--attention-backend", str),
    ("--num-kv-tokens", int),
    ("--max-queue-delay", float),
    ("--tensor-parallel-size", int),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="minillm serve",
        description="Serve a model over an OpenAI-compatible HTTP API "
        "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics) with "
        "minillm's engine, until Ctrl-C.",
    )
    p.add_argument("--model", default="tiny", help="'tiny' (offline, built in), 'smollm2', a hub name or a local path")
    p.add_argument("--served-model-name", default=None, help="the name clients send as 'model' (default: --model)")
    p.add_argument("--engine", default="chunked", help="the engine (default: %(default)s)")
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="the address to bind (default: %(default)s, this machine only; 0.0.0.0 opens the server to the network)",
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    p.add_argument(
        "--max-waiting",
        type=int,
        default=None,
        help="refuse new requests (503, Retry-After) while this many are waiting to run",
    )
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--num-threads",
        type=int,
        default=None,
        help="torch's CPU threads (default: MINILLM_NUM_THREADS if set, else every core for a real model: a "
        "server has the machine to itself; on a 2-core VM 2 threads served SmolLM2 at 1.3-1.8x 1 thread's capacity)",
    )
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=DEFAULT_SHUTDOWN_TIMEOUT,
        help="on Ctrl-C or SIGTERM, seconds the requests under way get to finish before they are ended "
        "with an error (default: %(default)s)",
    )
    limits = p.add_argument_group("what one client may hold (uvicorn's limits, and a deadline to read a request)")
    for f in fields(ServerLimits):
        limits.add_argument(
            "--" + f.name.replace("_", "-"), type=type(f.default), default=f.default, help="default: %(default)s"
        )
    options = p.add_argument_group("engine options (vLLM's names; only the ones given are passed)")
    for flag, kind in ENGINE_FLAGS:
        options.add_argument(flag, type=kind, default=None)
    options.add_argument(
        "--enable-prefix-caching", action="store_true", default=None, help="share cached prefix blocks"
    )
    options.add_argument(
        "--fast-path",
        action="store_true",
        default=None,
        help="chapter 9's fast path: fused projections and, on a CPU, prepacked oneDNN matmuls and C kernels; "
        "on a GPU, the small ops compiled by torch.compile (when the server starts)",
    )
    options.add_argument(
        "--cuda-graphs",
        action="store_true",
        default=None,
        help="chapter 9's CUDA graphs, captured at start: decode steps replayed whole, mixed steps in pieces with "
        "attention between (on a CPU, stand-ins with no speed-up)",
    )
    return p


def main(argv: list[str]) -> int:
    from minillm.llm import LLM

    args = parser().parse_args(argv)
    engine_options = {flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_")) for flag, _ in ENGINE_FLAGS}
    engine_options["enable_prefix_caching"] = args.enable_prefix_caching
    engine_options["fast_path"] = args.fast_path
    engine_options["cuda_graphs"] = args.cuda_graphs
    engine_options = {k: v for k, v in engine_options.items() if v is not None}
    if args.max_waiting is not None and args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be >= 1, got {args.max_waiting}")
    check_shutdown_timeout(args.shutdown_timeout)
    limits = ServerLimits(**{f.name: getattr(args, f.name) for f in fields(ServerLimits)})  # checked before loading
    llm = LLM(
        args.model,
        engine=args.engine,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        max_model_len=args.max_model_len,
        num_threads=cpu_threads.resolve_num_threads(args.model, args.num_threads, dedicated=True),
        **engine_options,
    )
    server = Server(
        llm,
        args.served_model_name or args.model,
        args.host,
        args.port,
        args.api_key,
        args.max_waiting,
        log_level=args.log_level,
        shutdown_timeout=args.shutdown_timeout,
        limits=limits,
    )
    print(
        f"minillm serve: model={args.model} engine={args.engine} device={llm.device} on http://{args.host}:{args.port}"
        " (Ctrl-C stops)",
        flush=True,
    )
    # uvicorn catches SIGTERM while it serves, drains, and raises the signal again once it is done,
    # under the handler it found: this one, so that a drained server exits 0 instead of being killed.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    server.run()
    return 0
