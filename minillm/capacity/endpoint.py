"""The capacity tool pointed at any OpenAI-compatible streaming server: minillm's own
(``minillm serve``), vLLM, SGLang, TGI.

``endpoint_target(url, model)`` is a target like ``simulator_target`` and ``llm_target`` (``targets.py``): it takes a
``Workload`` and returns a ``TargetRun``. It replays the workload as a client would, measuring what
a user sees:

- Each request is sent at its arrival time (seconds after the run starts), in the workload's order
  by one loop, then runs as its own asyncio task: posted to ``{url}/completions`` with the prompt
  as token ids, ``max_tokens`` from the workload, ``ignore_eos`` (vLLM's extension, which minillm
  and SGLang accept) so that every request generates its full length, greedy decoding, and
  ``stream: true``.
- The server sends one server-sent event per token (or per few tokens); the client stamps each
  with ``time.perf_counter()`` as it arrives. TTFT is the first token's time minus the time the
  request was sent, ITL the gaps between tokens, e2e the last token's time minus the send time.
- A client cannot see the server's queue, so ``waiting`` is None: the overload test judges the
  trend of TTFT instead (``minillm.capacity.is_overloaded``), which a client does see.

    from minillm.capacity import endpoint_target, find_capacity
    target = endpoint_target("http://127.0.0.1:8000/v1", "tiny")
    result = find_capacity(slo=["ttft_p95=0.1", "itl_p95=0.03"], target=target, mix="cpu chat")

The timings include the network and the server's HTTP work, as a user's would: on loopback that is
a millisecond or so per request, on a remote server add the round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from itertools import pairwise

import httpx

from minillm.capacity.targets import RequestResult, Target, TargetRun
from minillm.workloads import Workload

DEFAULT_TIMEOUT = 300.0  # seconds to wait for a connection, or for the next event of a stream
PROMPT_FORMATS = ("token_ids", "text")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


class EndpointError(RuntimeError):
    """The server could not be reached, or refused a request: the message names the URL and the
    server's own words."""


def endpoint_target(
    url: str,
    model: str,
    api_key: str | None = None,
    max_concurrency: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    check: bool = True,
    prompt_format: str = "token_ids",
) -> Target:
    """A target that replays each workload against the OpenAI-compatible server at ``url`` (its API
    root, e.g. ``http://127.0.0.1:8000/v1``) serving ``model`` (the name the server serves, as
    listed by its ``/v1/models``). ``api_key``: sent as a bearer token. ``max_concurrency``: at most
    this many requests in flight, the rest wait on the client (their wait counts in their TTFT,
    as a user's would); None sends every request at its arrival time. ``timeout``: seconds to wait
    for a connection or for the next event. ``check`` sends one short request now, so that a wrong
    URL, model name or key fails at once rather than in the middle of a search.

    ``prompt_format="text"`` is for a server or router that takes only text (SGLang's router, which
    routes on the prompt's characters): each token id is sent as one letter, a-z. Prompts that share
    token prefixes then share text prefixes, and on a byte-level tokenizer (the ``"tiny"`` model's)
    a prompt keeps its length; on any other tokenizer the lengths change."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url must start with http:// or https://, got {url!r}")
    if not model:
        raise ValueError("model: give the name the server serves (its /v1/models lists it)")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1 (or None for no limit), got {max_concurrency}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"prompt_format must be one of {', '.join(PROMPT_FORMATS)}, got {prompt_format!r}")
    endpoint = Endpoint(url, model, api_key, timeout, prompt_format)
    if check:
        endpoint.check()

    def run(workload: Workload) -> TargetRun:
        return TargetRun(run_coroutine(endpoint.replay(workload, max_concurrency)), waiting=None)

    run.description = f"OpenAI-compatible server at {url}, model {model!r}"
    return run


class Endpoint:
    """One server: how to build a request body, send it, and time its stream."""

    def __init__(self, url: str, model: str, api_key: str | None, timeout: float, prompt_format: str = "token_ids"):
        self.url, self.model, self.timeout, self.prompt_format = url, model, timeout, prompt_format
        self.completions_url = url + "/completions"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def body(self, prompt: list[int], max_tokens: int) -> dict:
        return {
            "model": self.model,
            "prompt": as_letters(prompt) if self.prompt_format == "text" else list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def check(self) -> None:
        """One request of one token, waited for in full: raises ``EndpointError`` if it fails."""
        try:
            with (
                httpx.Client(timeout=self.timeout, headers=self.headers) as client,
                client.stream("POST", self.completions_url, json=self.body([1, 2, 3, 4], 1)) as response,
            ):
                if response.status_code != 200:
                    response.read()
                    raise self.refused(response)
                for line in response.iter_lines():
                    self.parse(line)
        except httpx.HTTPError as err:
            raise self.unreachable(err) from None

    async def replay(self, workload: Workload, max_concurrency: int | None) -> list[RequestResult]:
        """Send every request of ``workload`` at its arrival time; their results in workload order."""
        limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
        gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        async with httpx.AsyncClient(timeout=self.timeout, headers=self.headers, limits=limits) as client:
            start, tasks = time.perf_counter(), []
            try:
                async with asyncio.TaskGroup() as group:  # one failure cancels the others
                    # one loop sends them, in order: a task per request sleeping until its own time
                    # could wake after a later one's when both were already due (by a millisecond)
                    for prompt, params, arrival in zip(
                        workload.prompts, workload.sampling_params, workload.arrival_times
                    ):
                        await asyncio.sleep(max(0.0, start + arrival - time.perf_counter()))
                        request = self.send(client, gate, start, time.perf_counter(), prompt, params.max_tokens)
                        tasks.append(group.create_task(request))
            except ExceptionGroup as group_error:
                raise first_error(group_error) from None
        return [task.result() for task in tasks]

    async def send(
        self, client: httpx.AsyncClient, gate, start: float, sent: float, prompt: list[int], max_tokens: int
    ) -> RequestResult:
        """One request, due at ``sent`` (the run began at ``start``), timed from that moment (a wait
        for ``gate`` counts) to each event with a token."""
        async with gate or contextlib.nullcontext():  # with max_concurrency: wait for a free place
            token_times, usage = await self.stream(client, prompt, max_tokens)
        if not token_times:
            raise EndpointError(f"{self.completions_url} streamed no token for a request of max_tokens={max_tokens}")
        # A server may send several tokens in one event (vLLM's and SGLang's stream intervals): usage
        # counts them, the stream does not say which event carried how many. The extra tokens are put
        # at the last event's time. The gaps are then the events' gaps plus one 0 s gap per extra
        # token, the same set of gaps (so the same ITL percentiles and TPOT) as if each extra token
        # were placed in its own event; only which token counts in the window's throughput shifts.
        token_times += [token_times[-1]] * max(0, usage - len(token_times))
        gaps = [b - a for a, b in pairwise(token_times)]
        return RequestResult(sent - start, token_times[0] - sent, gaps, token_times[-1] - sent)

    async def stream(self, client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> tuple[list[float], int]:
        """Post one streaming request: the arrival time of each event carrying a token, and the
        number of tokens the final usage chunk reports (0 if none). A last event with no text and a
        ``finish_reason`` (SGLang ends its stream so) carries no token once usage says every token
        has arrived: it is not counted, so it adds no token and no ~0 s gap."""
        token_times, usage, empty_final = [], 0, False
        try:
            async with client.stream("POST", self.completions_url, json=self.body(prompt, max_tokens)) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise self.refused(response)
                async for line in response.aiter_lines():
                    now = time.perf_counter()
                    event = self.parse(line)
                    if event is None:
                        continue
                    if choices := event.get("choices"):  # a token (its text may be empty: a partial character)
                        token_times.append(now)
                        choice = choices[0]
                        text = choice.get("text") or (choice.get("delta") or {}).get("content")
                        empty_final = not text and choice.get("finish_reason") is not None
                    if event.get("usage"):
                        usage = event["usage"].get("completion_tokens") or 0
        except httpx.HTTPError as err:
            raise self.unreachable(err) from None
        if empty_final and usage and len(token_times) > usage:
            token_times.pop()  # the empty closing chunk: the usage count was already reached without it
        return token_times, usage

    def parse(self, line: str) -> dict | None:
        """One line of a server-sent event stream: its JSON, or None (a blank line, a comment,
        ``[DONE]``). An error event mid-stream raises ``EndpointError``."""
        if not line.startswith("data:"):
            return None
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return None
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            raise EndpointError(f"{self.completions_url} sent an event that is not JSON: {data[:200]!r}") from None
        if "error" in event:
            raise EndpointError(f"{self.completions_url} failed mid-stream: {message_of(event)}")
        return event

    def refused(self, response: httpx.Response) -> EndpointError:
        """The error for an answer other than 200, with the server's message and a hint where one helps."""
        try:
            message = message_of(response.json())
        except ValueError:
            message = response.text.strip()[:300] or "(empty body)"
        hint = ""
        if response.status_code == 404 and "model" not in message.lower():
            hint = " (the URL should be the API's root, ending in /v1, as in http://127.0.0.1:8000/v1)"
        elif response.status_code in (400, 422) and "prompt" in message.lower():
            hint = (
                " (this tool sends each prompt as a list of token ids, as vLLM, SGLang and minillm accept; "
                "this server seems to want text in the 'prompt' field: try --prompt-format text)"
            )
        elif response.status_code == 401:
            hint = " (give the server's key with --api-key)"
        return EndpointError(f"{self.completions_url} answered {response.status_code}: {message}{hint}")

    def unreachable(self, err: httpx.HTTPError) -> EndpointError:
        if isinstance(err, httpx.ConnectError):
            return EndpointError(
                f"cannot connect to {self.url}: {err or 'connection refused'} (is the server running?)"
            )
        if isinstance(err, httpx.TimeoutException):
            return EndpointError(
                f"{self.completions_url} did not answer within {self.timeout:g} s ({type(err).__name__})"
            )
        return EndpointError(f"{self.completions_url}: {type(err).__name__}: {err}")


def as_letters(prompt: list[int]) -> str:
    """One letter per token id: what ``prompt_format="text"`` sends."""
    return "".join(LETTERS[t % len(LETTERS)] for t in prompt)


def message_of(body) -> str:
    """The message of an error body: OpenAI's ``{"error": {"message": ...}}``, or what there is."""
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)
    return str(error)


def first_error(group: BaseExceptionGroup) -> BaseException:
    """The first real failure in a task group's errors (the others are often its consequences)."""
    for err in group.exceptions:
        if isinstance(err, BaseExceptionGroup):
            return first_error(err)
        return err
    return group


def run_coroutine(coroutine):
    """Run ``coroutine`` to its end and return its result, from plain code (``asyncio.run``) or from
    a thread whose event loop is already running (a Jupyter notebook): there in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    result = {}

    def target():
        try:
            result["value"] = asyncio.run(coroutine)
        except BaseException as err:  # noqa: BLE001 -- re-raised in the caller's thread
            result["error"] = err

    thread = threading.Thread(target=target, name="capacity-endpoint")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
