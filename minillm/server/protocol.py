"""The OpenAI API's request bodies (vLLM's ``protocol.py``), as pydantic models, and its error body.

Validation is strict: ``"max_tokens": "5"`` is an error, not 5, and so is ``true`` for a number.
FastAPI validates a body against these models before a handler runs; ``api_server`` turns a
failure into HTTP 400 with OpenAI's error body, naming the field:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}

Fields that would change the output but that minillm does not implement (``logprobs``, ``n`` > 1,
``tools``, vLLM's ``repetition_penalty`` or ``guided_json``, ...) are refused with a 400 rather than
silently ignored; other unknown fields (``user``, ``metadata``) are ignored, as OpenAI's are.
vLLM's extensions that a benchmark needs are accepted: ``ignore_eos`` (fixed output lengths),
``top_k``, ``stop_token_ids`` and ``return_token_ids`` (the generated token ids in each choice, so a
client can check tokens, not just text). Every string must be valid Unicode: a lone surrogate
(``"\\ud800"``, which JSON can spell) is a 400 naming its field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# Fields that change the output and that minillm does not implement, from OpenAI's API and vLLM's
# extensions: refused when set to anything but the values that change nothing.
UNSUPPORTED = {
    # OpenAI
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None,),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None,),
    "reasoning_effort": (None,),
    "audio": (None,),
    "web_search_options": (None,),
    # vLLM's sampling and decoding extensions
    "min_tokens": (None, 0),
    "min_p": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "use_beam_search": (None, False),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
    "logits_processors": (None, []),
    "prompt_logprobs": (None,),
    "truncate_prompt_tokens": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    # vLLM's chat extensions
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
    "documents": (None,),
}


def valid_unicode(text: str) -> str:
    """``text`` unchanged, if it can be encoded: JSON's ``\\ud800`` escapes make Python strings that
    hold a lone surrogate, which no tokenizer (and no JSON response) can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"is not valid Unicode: a lone surrogate ({text[err.start]!r}) at position {err.start}"
        ) from None
    return text


Text = Annotated[str, AfterValidator(valid_unicode)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: bool = False  # one last chunk, with empty choices, carrying ``usage``


class SamplingFields(BaseModel):
    """What completions and chat share: the model, sampling, stopping and streaming."""

    model_config = ConfigDict(strict=True, extra="allow")  # unknown fields are ignored, as OpenAI's are

    model: Text
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # OpenAI's newer name for max_tokens (chat)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)  # OpenAI's default: sampling, not greedy
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # what torch.Generator.manual_seed takes
    stop: Text | list[Text] | list[int] | None = None  # strings (checked on the text) or token ids
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

    prompt: Text | list[Text] | list[int]


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text"]  # text only: minillm's models read no images or audio
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | list[TextPart]

    @property
    def text(self) -> str:
        """The content as one string (a list of text parts joined)."""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``: the assistant's next turn in a conversation."""

    messages: list[ChatMessage] = Field(min_length=1)


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: str | int | None = None
) -> dict:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
