"""From an OpenAI request body to an engine ``Request``, and from its tokens to OpenAI responses
(vLLM's ``serving_completion.py`` and ``serving_chat.py``, which differ only in how the prompt is
made and how a choice is shaped, so they share one class here).

A request's life on the HTTP side:

  1. ``prepare``: check what the engine cannot (fields minillm lacks, the context length, a KV pool
     too small, a full waiting queue), tokenize the prompt (chat: through the chat template), map
     OpenAI's sampling fields to ``SamplingParams``. Any problem is a ``RequestError``: HTTP 400
     (or 503 when the queue is full) naming the field, before the engine sees anything.
  2. ``AsyncLLM.add_request``: the request joins the running batch at the next step.
  3. Each token the engine sends back is detokenized (``IncrementalDetokenizer``, which also finds
     stop strings) and, when streaming, sent at once as one server-sent event, so a client can time
     every token (TTFT and ITL as a user sees them). The stream ends with ``data: [DONE]``.
  4. If the client goes away, or a stop string ends the text, the request is aborted in the engine:
     its slot and KV blocks are free for others at the next step.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from itertools import count

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, StreamingResponse

from minillm.request import Request, RequestStatus
from minillm.sampling_params import SamplingParams
from minillm.server.async_llm import AsyncLLM, EngineDeadError
from minillm.server.detokenizer import IncrementalDetokenizer
from minillm.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields, error_body

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat fills the context instead


class RequestError(Exception):
    """A request the server refuses: ``status`` (400, or 503 when the queue is full), OpenAI's
    error body, and headers (``Retry-After``)."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.param, self.type, self.code, self.headers = status, param, type, code, headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(
            error_body(str(self), self.type, self.param, self.code), status_code=self.status, headers=self.headers
        )


MAX_ECHO = 200  # the most characters of a client's value an error message quotes back


def preview(text: str, limit: int = MAX_ECHO) -> str:
    """``text``, or its first ``limit`` characters and how long it was: an error message never
    sends a client's 10 MB value back whole."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


class OpenAIServing:
    """Serves ``/v1/completions`` and ``/v1/chat/completions`` on top of an ``AsyncLLM``."""

    def __init__(self, async_llm: AsyncLLM, model_name: str, max_waiting: int | None = None):
        self.async_llm = async_llm
        self.llm = async_llm.llm
        self.model_name = model_name
        self.max_waiting = max_waiting
        self._ids = count()

    # --- 1. prepare ----------------------------------------------------------------------------
    def prepare(self, body: SamplingFields, chat: bool, arrival_time: float) -> tuple[Request, list[str]]:
        """The engine request for ``body`` and its stop strings; raises ``RequestError``.
        ``arrival_time``: when the body arrived, on the engine's clock (TTFT counts from there)."""
        unsupported = body.unsupported()
        if unsupported:
            raise RequestError(f"{unsupported} is not supported by minillm", unsupported)
        if body.n != 1:
            raise RequestError(f"n={body.n} is not supported: minillm returns one choice; send n requests instead", "n")
        if body.model != self.model_name:
            raise RequestError(
                f"The model `{preview(body.model)}` does not exist: this server serves `{self.model_name}`",
                "model",
                status=404,
                code="model_not_found",
            )  # OpenAI's answer
        prompt_field = "messages" if chat else "prompt"
        prompt_ids = self._chat_prompt_ids(body) if chat else self._prompt_ids(body)
        max_model_len, vocab = self.llm.max_model_len, self.llm.config.vocab_size
        if not prompt_ids:
            raise RequestError(f"{prompt_field} is empty: it has no tokens", prompt_field)
        bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"{prompt_field} has token id {bad}, outside the vocabulary [0, {vocab})", prompt_field)
        if len(prompt_ids) >= max_model_len:
            raise RequestError(
                f"{prompt_field} has {len(prompt_ids)} tokens: this model's context is {max_model_len} "
                "tokens, and at least one must be left to generate",
                prompt_field,
            )
        max_tokens = body.max_tokens or body.max_completion_tokens
        param = (
            "max_tokens"
            if body.max_tokens is not None or body.max_completion_tokens is None
            else "max_completion_tokens"
        )
        if max_tokens is None:
            max_tokens = self._default_max_tokens(len(prompt_ids), chat)
        if len(prompt_ids) + max_tokens > max_model_len:
            raise RequestError(
                f"{param}={max_tokens} is too large: {len(prompt_ids)} prompt tokens + {max_tokens} "
                f"exceeds this model's context of {max_model_len} tokens",
                param,
            )

        stop_strings, stop_ids = split_stop(body.stop)
        stop_ids += body.stop_token_ids or []
        bad = next((t for t in stop_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(
                f"stop token id {bad} is outside the vocabulary [0, {vocab})",
                "stop_token_ids" if body.stop_token_ids and bad in body.stop_token_ids else "stop",
            )
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            seed=body.seed,
            ignore_eos=body.ignore_eos,
            stop_token_ids=stop_ids or None,
        )
        n = next(self._ids)
        # A seed makes the request reproducible (the same tokens as LLM.generate with this seed);
        # without one every request draws its own.
        seed = body.seed if body.seed is not None else secrets.randbits(63)
        request = Request(str(n), prompt_ids, params, arrival_time=arrival_time, seed=seed)
        try:
            self.async_llm.check_request(request)  # e.g. more KV cache than the whole pool
        except ValueError as err:
            fits_alone = Request("check", prompt_ids, SamplingParams(max_tokens=1), 0.0)
            try:
                self.async_llm.check_request(fits_alone)
                where = param
            except ValueError:
                where = prompt_field
            raise RequestError(f"this request could never fit the server's KV cache: {err}", where) from None
        if self.max_waiting is not None and self.async_llm.num_unfinished(RequestStatus.WAITING) >= self.max_waiting:
            raise RequestError(
                f"the server is overloaded: {self.max_waiting} requests are already waiting "
                "(--max-waiting); retry later",
                status=503,
                type="server_overloaded",
                headers={"Retry-After": "1"},
            )
        return request, stop_strings

    def _prompt_ids(self, body: CompletionRequest) -> list[int]:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise RequestError(f"prompt has {len(prompt)} prompts: minillm takes one prompt per request", "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str) and self.llm.tokenizer is None:
            raise RequestError("this model has no tokenizer: give the prompt as a list of token ids", "prompt")
        return self.llm.encode(prompt)

    def _chat_prompt_ids(self, body: ChatCompletionRequest) -> list[int]:
        """The conversation through the model's chat template. A model without one (``"tiny"``, a base
        model) cannot tell where a turn ends: refused, as vLLM and ``LLM.chat`` refuse it."""
        if not getattr(self.llm.tokenizer, "chat_template", None):
            raise RequestError(
                "this model has no chat template (it is not a chat model), so it cannot serve "
                "/v1/chat/completions: send the text to /v1/completions instead",
                "messages",
            )
        try:
            return list(
                self.llm.tokenizer.apply_chat_template([{"role": m.role, "content": m.text} for m in body.messages])
            )
        except Exception as err:  # noqa: BLE001 -- a template may reject a conversation (roles out of turn)
            raise RequestError(
                f"the chat template failed: {type(err).__name__}: {preview(str(err))}", "messages"
            ) from None

    def _default_max_tokens(self, num_prompt_tokens: int, chat: bool) -> int:
        """OpenAI's defaults: 16 for completions; for chat, the rest of the context (and of the
        KV pool, when it is smaller), so that the model ends its turn itself."""
        room = self.llm.max_model_len - num_prompt_tokens
        if not chat:
            return max(1, min(DEFAULT_COMPLETION_MAX_TOKENS, room))
        capacity = self.async_llm.engine.scheduler.kv_capacity_tokens
        return max(1, min(room, capacity - num_prompt_tokens) if capacity else room)

    # --- 2-4. run and respond --------------------------------------------------------------------
    async def create(self, body: SamplingFields, raw_request: HTTPRequest, chat: bool):
        arrival_time = self.async_llm.engine.clock.now()  # before tokenizing: the user waits for that too
        try:
            request, stop_strings = self.prepare(body, chat, arrival_time)
            stream = self.async_llm.add_request(request)
        except RequestError as err:
            return err.response()
        except EngineDeadError as err:
            return JSONResponse(error_body(str(err), "server_error"), status_code=503)
        response = ResponseBuilder(self, request, stream, stop_strings, body, chat)
        if body.stream:
            return StreamingResponse(
                response.events(),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await until_disconnected(response.collect(), raw_request)


def split_stop(stop) -> tuple[list[str], list[int]]:
    """OpenAI's ``stop`` (a string, strings, or -- minillm and vLLM -- token ids) as (strings, ids)."""
    if stop is None:
        return [], []
    if isinstance(stop, str):
        return [stop], []
    return [s for s in stop if isinstance(s, str)], [t for t in stop if isinstance(t, int)]


async def until_disconnected(coro, raw_request: HTTPRequest):
    """Await ``coro``, cancelling it if the client disconnects first (vLLM's ``with_cancellation``):
    a non-streaming client that gives up must not leave its request running."""
    task = asyncio.ensure_future(coro)

    async def disconnected():
        while (await raw_request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()  # its ``finally`` aborts the request in the engine
        return JSONResponse(error_body("client disconnected"), status_code=499)
    return task.result()


class ResponseBuilder:
    """One request's answer, built from its token events: a stream of chunks or one body."""

    def __init__(
        self, serving: OpenAIServing, request: Request, stream, stop_strings, body: SamplingFields, chat: bool
    ):
        self.serving, self.request, self.stream, self.body, self.chat = serving, request, stream, body, chat
        self.detokenizer = IncrementalDetokenizer(serving.llm.tokenizer, stop_strings)
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request.request_id}"
        self.created = int(time.time())
        self.num_tokens = 0  # tokens generated so far (up to a stop string)
        self.finish_reason = None

    async def tokens(self):
        """``(text delta, token id, finish reason)`` per generated token (the reason None until the
        last one), until the request ends. On a stop string the request is aborted in the engine and
        the text ends before it. If this is cancelled (the client went away) the request is aborted."""
        done = False
        try:
            while not done:
                event = await self.stream.get()
                ids = self.request.output_token_ids[: event.index + 1]  # as of this event: the list keeps growing
                if event.finish_reason == "stop":
                    ids = ids[:-1]  # a stop token (or EOS) ends the text without appearing in it, as in OpenAI's API
                delta, stopped = self.detokenizer.update(ids, event.finished)
                self.num_tokens = event.index + 1
                if stopped:
                    self.serving.async_llm.abort(self.request.request_id, "stop")
                done = stopped or event.finished
                self.finish_reason = "stop" if stopped else event.finish_reason
                yield delta, event.token_id, self.finish_reason
        finally:
            if not done:
                self.serving.async_llm.abort(self.request.request_id)

    async def collect(self) -> JSONResponse:
        text, token_ids = [], []
        try:
            async for delta, token_id, _ in self.tokens():
                text.append(delta)
                token_ids.append(token_id)
        except EngineDeadError as err:
            return JSONResponse(error_body(str(err), "server_error"), status_code=500)
        choice = {"index": 0, "logprobs": None, "finish_reason": self.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": "".join(text)}
        else:
            choice["text"] = "".join(text)
        if self.body.return_token_ids:
            choice["token_ids"] = token_ids
        return JSONResponse(
            {
                "id": self.id,
                "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created,
                "model": self.serving.model_name,
                "choices": [choice],
                "usage": self.usage(),
            }
        )

    async def events(self):
        """Server-sent events: one chunk per generated token, sent as soon as it is made."""
        if self.chat:  # OpenAI's first chat chunk names the role
            yield self._sse(self._chunk({"role": "assistant", "content": ""}, None, None))
        try:
            async for delta, token_id, finish_reason in self.tokens():
                yield self._sse(self._chunk({"content": delta} if self.chat else delta, finish_reason, token_id))
        except EngineDeadError as err:
            yield self._sse(error_body(str(err), "server_error"))
        else:
            options = self.body.stream_options
            if options is not None and options.include_usage:
                yield self._sse(
                    {
                        "id": self.id,
                        "object": self._chunk_object(),
                        "created": self.created,
                        "model": self.serving.model_name,
                        "choices": [],
                        "usage": self.usage(),
                    }
                )
        yield "data: [DONE]\n\n"

    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _chunk(self, delta, finish_reason, token_id) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        choice["delta" if self.chat else "text"] = delta
        if self.body.return_token_ids and token_id is not None:
            choice["token_ids"] = [token_id]
        return {
            "id": self.id,
            "object": self._chunk_object(),
            "created": self.created,
            "model": self.serving.model_name,
            "choices": [choice],
        }

    def usage(self) -> dict:
        n_prompt = self.request.num_prompt_tokens
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": self.num_tokens,
            "total_tokens": n_prompt + self.num_tokens,
        }

    @staticmethod
    def _sse(obj) -> str:
        return f"data: {json.dumps(obj)}\n\n"
