"""``LLM``: the user-facing entry point, shaped like vLLM's.

    llm = LLM("tiny")
    outputs = llm.generate(["Hello", "The KV cache"], SamplingParams(max_tokens=32))
    llm.trace  # one row per engine step of that call

An ``LLM`` builds its engine once, as vLLM does: the options are checked before any weights load,
the KV pool is sized once (for ``gpu_memory_utilization``: after measuring what a forward pass
needs) and allocated once, and every ``generate``/``chat``/``stream`` call reuses it. A call
validates all its input first, so a bad request raises before anything runs; between calls the
pool is empty, whether the last call finished, raised, or was abandoned part way.
``LLM(other_llm, engine=...)`` runs another engine on a model already loaded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from minillm.engines import build_engine, check_engine_name, check_engine_options
from minillm.llm_engine import TokenEvent
from minillm.models.cpu_threads import resolve_num_threads
from minillm.models.loader import as_token_ids, load_model
from minillm.models.tokenizer import ByteTokenizer
from minillm.request import Request, RequestOutput
from minillm.sampling_params import SamplingParams

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class LLM:
    """A model and one engine over it. ``model`` is ``"tiny"``, a hub name, a local path, a
    transformers model, or another ``LLM``, whose weights, tokenizer, device and dtype are then
    shared (each ``LLM`` has its own engine and KV pool)."""

    def __init__(
        self,
        model="tiny",
        engine: str = "naive",
        dtype=None,
        device=None,
        seed: int = 0,
        max_model_len: int | None = None,
        num_threads: int | None = None,
        **engine_options,
    ):
        check_engine_name(engine)
        check_engine_options(engine, engine_options)  # by value: before any weights load or memory is allocated
        self.engine_name = engine
        self.engine_options = engine_options
        self.seed = seed
        if isinstance(model, LLM):
            self._share_model(model, dtype, device, num_threads)
        else:
            self._load(model, dtype, device, num_threads)
        limit = self.config.max_position_embeddings
        if max_model_len is not None and not 1 <= max_model_len <= limit:
            raise ValueError(
                f"max_model_len must be between 1 and the model's max_position_embeddings ({limit}), "
                f"got {max_model_len}"
            )
        self.max_model_len = max_model_len or limit
        self.llm_engine = build_engine(engine, self.model, self.device, self.eos_token_ids, **engine_options)
        self._outputs: list[RequestOutput] = []
        self._running = False  # a call is under way: the engine is not free for another
        self._served = False  # a server (``minillm.server``) steps the engine

    def _load(self, model, dtype, device, num_threads) -> None:
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = resolve_dtype(dtype, self.device)
        self.num_threads = resolve_num_threads(model, num_threads)  # a bad value fails before anything loads
        if self.device.type == "cpu" and torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)  # chosen, not torch's default: see minillm.models.cpu_threads
        self.model, self.tokenizer = load_model(model, self.dtype, self.device)
        self.config = self.model.config
        self.eos_token_ids = _eos_token_ids(self.tokenizer, self.model)
        self._warm_up()

    def _share_model(self, other: LLM, dtype, device, num_threads) -> None:
        """Take ``other``'s model, tokenizer and settings as they are: a second engine on the same weights."""
        if device is not None and torch.device(device) != other.device:
            raise ValueError(
                f"device={device!r}: an LLM made from another LLM runs on that LLM's device ({other.device})"
            )
        if dtype is not None and resolve_dtype(dtype, other.device) != other.dtype:
            raise ValueError(f"dtype={dtype!r}: an LLM made from another LLM runs in that LLM's dtype ({other.dtype})")
        if num_threads is not None and num_threads != other.num_threads:
            raise ValueError(
                f"num_threads={num_threads!r}: torch's thread count is per process; this model runs with "
                f"{other.num_threads}"
            )
        self.device, self.dtype, self.num_threads = other.device, other.dtype, other.num_threads
        self.model, self.tokenizer, self.config = other.model, other.tokenizer, other.config
        self.eos_token_ids = other.eos_token_ids

    def _warm_up(self) -> None:
        """One short prefill and decode, so the first measured request does not pay for lazy
        initialisation (kernel selection, allocator growth) that a long-running server pays once."""
        prompt_len = min(8, self.config.max_position_embeddings - 2)
        if prompt_len >= 1:
            # On the naive engine: a dynamic batcher would hold a lone request for max_queue_delay.
            engine = build_engine("naive", self.model, self.device, self.eos_token_ids)
            engine.add_request(Request("warm-up", [0] * prompt_len, SamplingParams(max_tokens=2, ignore_eos=True), 0.0))
            engine.run_to_completion()

    @property
    def eos_token_id(self) -> int | None:
        """The main end-of-sequence id; generation stops on any of ``eos_token_ids``."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @eos_token_id.setter
    def eos_token_id(self, value: int | None) -> None:
        self.eos_token_ids = as_token_ids(value)
        self.llm_engine.set_eos_token_ids(self.eos_token_ids)

    @property
    def trace(self):
        """One row per engine step of the last call (a fresh ``Trace`` for each call)."""
        return self.llm_engine.trace

    # --- calls ---------------------------------------------------------------------------------
    def generate(self, prompts, sampling_params=None, arrival_times=None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order."""
        for _ in self.stream(prompts, sampling_params, arrival_times):
            pass
        return self._outputs

    def stream(self, prompts, sampling_params=None, arrival_times=None) -> Iterator[TokenEvent]:
        """Like ``generate``, but yields each token as the engine produces it. Each event carries
        ``text``: the new characters this token completes. ``generate``'s outputs are in
        ``llm.last_outputs`` once the iterator is exhausted. A stream abandoned part way (closed,
        or dropped) aborts its unfinished requests, freeing their KV cache."""
        requests = self._make_requests(prompts, sampling_params, arrival_times)
        engine = self.llm_engine
        for r in requests:
            engine.scheduler.check_request(r)  # a request this engine could never run: refused before any runs
        self._claim()
        try:
            engine.reset()
            for r in requests:
                engine.add_request(r)
            emitted = {r.request_id: "" for r in requests}
            by_id = {r.request_id: r for r in requests}
            for event in engine.run():
                event.text = self._text_delta(by_id[event.request_id], emitted, event.finished)
                yield event
            self._outputs = [self._to_output(r) for r in requests]
        finally:
            engine.abort_all_requests()  # none left after a whole run; after an error, every slot and block back
            self._running = False

    def chat(self, messages, sampling_params=None) -> list[RequestOutput]:
        """``generate`` for chat models: ``messages`` is one conversation (a list of
        ``{"role": ..., "content": ...}`` dicts) or a list of conversations, run as one batch. Each
        is formatted by the model's chat template, ending where the assistant's reply begins."""
        if not getattr(self.tokenizer, "chat_template", None):
            if self.tokenizer is None:
                what = "has no tokenizer"
            elif isinstance(self.tokenizer, ByteTokenizer):
                what = "has the byte-level tokenizer (as 'tiny' does), which has no chat template"
            else:
                what = "has a tokenizer without a chat template (a base model, not a chat one)"
            raise ValueError(
                f"llm.chat needs a chat template, and this model {what}: use llm.generate with plain "
                "prompts, or load a chat (instruct) model"
            )
        conversations = _as_conversations(messages)
        prompts = []
        for i, conversation in enumerate(conversations):
            try:
                prompts.append(self.tokenizer.apply_chat_template(conversation))
            except Exception as err:  # a template may reject a conversation (e.g. roles out of turn)
                raise ValueError(f"conversation {i}: the chat template failed ({type(err).__name__}: {err})") from err
        return self.generate(prompts, sampling_params)

    def reset_prefix_cache(self) -> bool:
        """Forget every block the prefix cache holds (vLLM's name), so the next call starts cold: True
        when done; False for an engine without prefix caching on (nothing to forget)."""
        scheduler = self.llm_engine.scheduler
        return scheduler.enable_prefix_caching and scheduler.reset_prefix_cache()

    def stats(self) -> dict:
        """What the last call did (``num_steps``, ``num_preemptions``, ``num_swapped_out``: from its
        trace) and the engine's scheduler now (``num_running``, ``num_waiting``, ``kv_cache_usage``
        in 0-1, and for the paged engines the pool: ``num_total_blocks``, ``num_free_blocks``, ...,
        and the prefix cache's ``prefix_cache_queries`` / ``prefix_cache_hits``: tokens looked up and
        found, since the engine was built). Between calls no request holds a block."""
        trace = self.trace
        stats = {
            "engine": self.engine_name,
            **self.llm_engine.scheduler.stats(),
            "num_steps": len(trace),
            "num_preemptions": sum(len(s.preempted_ids) for s in trace),
            "num_swapped_out": sum(len(s.swapped_out_ids) for s in trace),
        }
        if self.llm_engine.scheduler.num_gpu_blocks is None:
            stats["note"] = (
                f"engine {self.engine_name!r} has no KV blocks (the paged engine does): its KV cache is "
                "one buffer per request, freed when the request finishes"
            )
        return stats

    # --- who steps the engine ------------------------------------------------------------------
    def _claim(self) -> None:
        if self._served:
            raise RuntimeError(
                "this LLM's engine is serving HTTP requests (a server made from it is running): stop "
                "the server first, or make another LLM(llm, engine=...) for offline calls"
            )
        if self._running:
            raise RuntimeError(
                "this LLM is already running a call (a stream not yet exhausted or closed): finish it "
                "or call .close() on it first"
            )
        self._running = True

    def start_serving(self):
        """Hand the engine to a server (``minillm.server.AsyncLLM``), which steps it from its own
        thread until ``stop_serving``; meanwhile offline calls are refused. Returns the engine, reset."""
        self._claim()
        self._running, self._served = False, True
        self.llm_engine.reset()
        return self.llm_engine

    def stop_serving(self) -> None:
        """The server stopped: abort whatever it left unfinished, and take the engine back."""
        self.llm_engine.abort_all_requests()
        self._served = False

    @property
    def last_outputs(self) -> list[RequestOutput]:
        return self._outputs

    def encode(self, prompt) -> list[int]:
        """Token ids of a prompt given as text or as ids."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model was given without a tokenizer: pass prompts as lists of token ids")
            return self.tokenizer.encode(prompt) if prompt else []
        return [int(t) for t in prompt]

    # --- validation -------------------------------------------------------------------------
    def _make_requests(self, prompts, sampling_params, arrival_times) -> list[Request]:
        prompts = _as_prompt_list(prompts)
        n = len(prompts)
        params = _per_prompt(sampling_params, n)
        arrivals = _arrival_times(arrival_times, n)
        vocab = self.config.vocab_size
        requests = []
        for i, (prompt, p, t) in enumerate(zip(prompts, params, arrivals)):
            ids = self.encode(prompt)
            if not ids:
                raise ValueError(f"prompt {i} is empty")
            bad = [tok for tok in ids if not 0 <= tok < vocab]
            if bad:
                raise ValueError(f"prompt {i} has token id {bad[0]} outside the vocabulary [0, {vocab})")
            if len(ids) > self.max_model_len:
                raise ValueError(f"prompt {i} has {len(ids)} tokens, more than max_model_len={self.max_model_len}")
            if len(ids) + p.max_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt {i}: {len(ids)} prompt tokens + max_tokens={p.max_tokens} exceeds "
                    f"max_model_len={self.max_model_len}"
                )
            seed = p.seed if p.seed is not None else self.seed * 1_000_003 + i
            requests.append(Request(str(i), ids, p, arrival_time=t, seed=seed))
        return requests

    def _text_delta(self, request: Request, emitted: dict, finished: bool) -> str:
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(request.output_token_ids)
        if text.endswith("\ufffd") and not finished:
            return ""  # a multi-byte character is only partly generated: wait for the rest
        delta = text[len(emitted[request.request_id]) :]
        emitted[request.request_id] = text
        return delta

    def _to_output(self, r: Request) -> RequestOutput:
        text = self.tokenizer.decode(r.output_token_ids) if self.tokenizer else ""
        return RequestOutput(
            r.request_id,
            r.prompt_token_ids,
            list(r.output_token_ids),
            text,
            r.finish_reason,
            r.metrics,
            r.num_cached_tokens or 0,
        )


def _eos_token_ids(tokenizer, model) -> tuple[int, ...]:
    """The tokenizer's EOS first, then the checkpoint's (generation config, else config), without
    repeats. All of them stop generation: a chat model's tokenizer may name only the end of text
    while its generation config also lists the end of a turn."""
    ids = as_token_ids(getattr(tokenizer, "eos_token_id", None)) + model.eos_token_ids
    return tuple(dict.fromkeys(ids))


def _as_conversations(messages) -> list[list[dict]]:
    """One conversation or a list of them, checked: every message a dict with a string role and content."""
    if isinstance(messages, (str, dict)) or not isinstance(messages, (list, tuple)):
        raise ValueError(
            f"messages must be a list of {{'role': ..., 'content': ...}} dicts or a list of such lists, got "
            f"{type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages is empty: give at least one message")
    one = not isinstance(messages[0], (list, tuple))
    conversations = [list(messages)] if one else [list(c) if isinstance(c, (list, tuple)) else c for c in messages]
    for i, conversation in enumerate(conversations):
        where = "messages" if one else f"messages[{i}]"
        if not isinstance(conversation, list):
            raise ValueError(f"{where} must be a list of messages, got {type(conversation).__name__}")
        if not conversation:
            raise ValueError(f"{where} is an empty conversation: give at least one message")
        for j, message in enumerate(conversation):
            if not isinstance(message, dict):
                raise ValueError(f"{where}[{j}] must be a dict with 'role' and 'content', got {type(message).__name__}")
            for field in ("role", "content"):
                if field not in message:
                    raise ValueError(f"{where}[{j}] has no {field!r}")
                if not isinstance(message[field], str):
                    raise ValueError(f"{where}[{j}][{field!r}] must be a string, got {type(message[field]).__name__}")
    return conversations


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """The dtype a model runs in: as asked, else float32 on a CPU and bfloat16 on a GPU that computes
    in it (compute capability 8.0 and up), else float16 (Colab's T4 is 7.5), as vLLM falls back."""
    if dtype is None:
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else torch.float16
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        return DTYPES[dtype]
    return dtype


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    if all(isinstance(t, int) for t in prompts):
        return [prompts]  # one prompt given as token ids
    return prompts


def _per_prompt(sampling_params, n: int) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * n
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    params = list(sampling_params)
    if len(params) != n:
        raise ValueError(f"sampling_params has {len(params)} entries for {n} prompts: give one, or one per prompt")
    return params


def _arrival_times(arrival_times, n: int) -> list[float]:
    if arrival_times is None:
        return [0.0] * n
    times = [float(t) for t in arrival_times]
    if len(times) != n:
        raise ValueError(f"arrival_times has {len(times)} entries for {n} prompts")
    for i, t in enumerate(times):
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"arrival_times[{i}] must be a finite number >= 0, got {t}")
    return times
