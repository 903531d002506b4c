"""The FastAPI app: OpenAI's routes over one ``AsyncLLM`` (vLLM's ``api_server.py``).

    POST /v1/completions        continue a prompt          (``stream: true``: server-sent events)
    POST /v1/chat/completions   answer a conversation      (``stream: true``: server-sent events)
    GET  /v1/models             the one model served
    GET  /v1/trace?since=STEP&limit=N   at most N (1,000; at most 10,000) of the engine's trace rows
                                from step STEP on, as JSON (minillm's own: the notebook draws the
                                live slots view from it); built off the event loop
    GET  /health                200 while the engine thread runs, else 503
    GET  /metrics               Prometheus text format (``minillm.server.prometheus``)

Every error is OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: a malformed or
ill-typed body is a 400 naming the field, never FastAPI's default 422. With ``api_key`` the
``/v1`` routes want ``Authorization: Bearer <api_key>`` (401 otherwise); ``/health`` and
``/metrics`` stay open, as in vLLM, for load balancers and Prometheus. An error message quotes at
most ``MAX_ECHO`` characters of what the client sent.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import time
from bisect import bisect_left
from operator import attrgetter

from fastapi import FastAPI, Query
from fastapi import Request as HTTPRequest
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from minillm.server.async_llm import AsyncLLM
from minillm.server.prometheus import ServerMetrics
from minillm.server.protocol import ChatCompletionRequest, CompletionRequest, error_body
from minillm.server.serving import OpenAIServing, preview
from minillm.trace import StepRecord

DEFAULT_TRACE_ROWS, MAX_TRACE_ROWS = 1_000, 10_000  # /v1/trace's page of rows, and the most one call may ask for


def build_app(
    async_llm: AsyncLLM,
    model_name: str,
    metrics: ServerMetrics | None = None,
    api_key: str | None = None,
    max_waiting: int | None = None,
) -> FastAPI:
    """The app serving ``async_llm`` under ``model_name``. ``max_waiting``: refuse new requests
    (503, ``Retry-After``) while that many accepted ones are waiting to run (None: no bound)."""
    if max_waiting is not None and (
        isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 1
    ):
        # every request waits at least until the next step boundary, so 0 would refuse them all
        raise ValueError(f"max_waiting must be None (no bound) or an integer >= 1, got {max_waiting!r}")
    app = FastAPI(title="minillm", description="An OpenAI-compatible server over minillm's engine")
    serving = OpenAIServing(async_llm, model_name, max_waiting)
    app.state.async_llm, app.state.serving, app.state.metrics = async_llm, serving, metrics
    created = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: HTTPRequest, exc: RequestValidationError):
        return JSONResponse(validation_error_body(exc), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: HTTPRequest, exc: StarletteHTTPException):
        return JSONResponse(error_body(str(exc.detail)), status_code=exc.status_code)  # e.g. 404 for an unknown route

    if api_key is not None:
        expected = f"Bearer {api_key}".encode()

        @app.middleware("http")
        async def require_api_key(request: HTTPRequest, call_next):
            if request.url.path.startswith("/v1"):
                given = request.headers.get("authorization", "").encode()
                if not hmac.compare_digest(given, expected):  # a constant-time comparison
                    return JSONResponse(
                        error_body(
                            "invalid or missing API key: send 'Authorization: Bearer <key>'",
                            "authentication_error",
                            code="invalid_api_key",
                        ),
                        status_code=401,
                    )
            return await call_next(request)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw_request: HTTPRequest):
        return await serving.create(body, raw_request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw_request: HTTPRequest):
        return await serving.create(body, raw_request, chat=True)

    @app.get("/v1/models")
    async def models():
        card = {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "minillm",
            "max_model_len": async_llm.llm.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.get("/v1/trace")
    async def trace(since: int = 0, limit: int = Query(DEFAULT_TRACE_ROWS, ge=1, le=MAX_TRACE_ROWS)):
        # Rows are built and serialised in a worker thread: a large page must not hold up the event
        # loop, which streams every other client's tokens.
        body = await run_in_threadpool(
            lambda: json.dumps(trace_json(async_llm.trace, since, async_llm.requests(), limit))
        )
        return Response(body, media_type="application/json")

    @app.get("/health")
    async def health():
        if not async_llm.is_running:
            return JSONResponse(error_body(async_llm.dead_message(), "server_error"), status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus_metrics():
        if metrics is None:
            return Response("", media_type="text/plain")
        return Response(metrics.render(), media_type=metrics.content_type)

    return app


def validation_error_body(exc: RequestValidationError) -> dict:
    """OpenAI's error body for the first problem pydantic found, naming its field
    (``messages[0].content``); a body that is not JSON at all names none."""

    # pydantic's location, less FastAPI's "body" / "query" and the union branch tried (("prompt", "str") -> "prompt")
    def where(error):
        return [part for part in error.get("loc", ()) if part not in ("body", "query") and not _is_type_tag(part)]

    errors = exc.errors()
    # The first field at fault; of a union's several complaints about it, the one that got furthest
    # (a list of content parts with a bad "type" says so, not "Input should be a valid string").
    field = where(errors[0])[:1]
    error = max((e for e in errors if where(e)[:1] == field), key=lambda e: len(where(e)))
    loc = where(error)
    if error.get("type") == "json_invalid":
        return error_body(f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error.get('msg'))}")
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or None
    if error.get("type") == "missing":
        message = f"{param} is required" if param else "the request body is missing"
    elif param is None:
        message = f"the request body must be a JSON object: {error.get('msg')}"
    else:
        message = f"{param}: {error.get('msg')}, got {preview(json.dumps(error.get('input'), default=str))}"
    return error_body(message, param=param)


STEP_FIELDS = dataclasses.fields(StepRecord)


def _is_type_tag(part) -> bool:
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "dict", "list") or "[" in part)


def trace_json(trace, since: int = 0, requests=(), limit: int = DEFAULT_TRACE_ROWS) -> dict:
    """At most ``limit`` rows of ``trace`` with ``step >= since``, as plain dicts, and what to ask for
    next: a client polls ``/v1/trace?since=<next>`` to follow the engine step by step, or to page
    through what it missed. ``requests``: the times of each request not finished before those rows
    began (arrival, first scheduled, first token, finished; engine clock seconds), which a slots view
    needs to place the waiting ones."""
    steps = trace.steps[:]  # the engine thread appends (and drops old rows) meanwhile: read a copy
    first = bisect_left(steps, since, key=attrgetter("step"))
    rows = steps[first : first + limit]
    start = rows[0].start_time if rows else float("inf")
    live = [r for r in requests if r.metrics.finished_time is None or r.metrics.finished_time >= start]
    return {
        "num_gpu_blocks": trace.num_gpu_blocks,
        "block_size": trace.block_size,
        "next": rows[-1].step + 1 if rows else since,
        "steps": [{f.name: getattr(r, f.name) for f in STEP_FIELDS} for r in rows],
        "requests": [
            {
                "request_id": r.request_id,
                "num_prompt_tokens": r.num_prompt_tokens,
                "num_output_tokens": len(r.output_token_ids),
                "finish_reason": r.finish_reason,
                **{
                    k: getattr(r.metrics, k)
                    for k in ("arrival_time", "first_scheduled_time", "first_token_time", "finished_time")
                },
            }
            for r in live
        ],
    }
