"""The OpenAI API's request bodies (vLLM's ``protocol.py``), as pydantic models, and its error body.

Validation is strict: ``"max_tokens": "5"`` is an error, not 5, and so is ``true`` for a number.
FastAPI validates a body against these models before a handler runs; ``api_server`` turns a
failure into HTTP 400 with OpenAI's error body, naming the field:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}

Fields OpenAI defines that minillm does not implement (``logprobs``, ``n`` > 1, ...) are refused
with a 400 rather than silently ignored. vLLM's extensions that a benchmark needs are accepted:
``ignore_eos`` (fixed output lengths), ``top_k``, ``stop_token_ids`` and ``return_token_ids`` (the
generated token ids in each choice, so a client can check tokens, not just text).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# OpenAI fields minillm does not implement: refused when set to anything but their defaults
UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
               "suffix": (None,), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
               "logit_bias": (None, {}), "tools": (None, []), "response_format": (None,)}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: bool = False  # one last chunk, with empty choices, carrying ``usage``


class SamplingFields(BaseModel):
    """What completions and chat share: the model, sampling, stopping and streaming."""

    model_config = ConfigDict(strict=True, extra="allow")  # unknown fields are ignored, as OpenAI's are

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # OpenAI's newer name for max_tokens (chat)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)  # OpenAI's default: sampling, not greedy
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-2**63, le=2**64 - 1)  # what torch.Generator.manual_seed takes
    stop: str | list[str] | list[int] | None = None  # strings (checked on the text) or token ids
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)  # only 1: one choice per request (send n requests for n samples)
    # vLLM's extensions
    top_k: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    return_token_ids: bool = False

    def unsupported(self) -> str | None:
        """The first field given that minillm does not implement, if any."""
        extra = self.model_extra or {}
        for name, defaults in UNSUPPORTED.items():
            if name in extra and not any(extra[name] == d and type(extra[name]) is type(d) for d in defaults):
                return name
        return None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: continue a prompt (text, or a list of token ids)."""

    prompt: str | list[int] | list[str]


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text"]  # text only: minillm's models read no images or audio
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        """The content as one string (a list of text parts joined)."""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``: the assistant's next turn in a conversation."""

    messages: list[ChatMessage] = Field(min_length=1)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
