"""Tokenizers: a byte-level one built in code for the offline ``"tiny"`` model, and a thin wrapper
around a Hugging Face tokenizer for real checkpoints. Both expose the same four things the engine
needs: ``encode``, ``decode``, ``eos_token_id`` and ``vocab_size``."""

from __future__ import annotations


class ByteTokenizer:
    """Each UTF-8 byte is a token (ids 0-255); then BOS, EOS and PAD. Needs no files at all."""

    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id, *text.encode("utf-8")]

    def decode(self, token_ids: list[int]) -> str:
        data = bytes(t for t in token_ids if t < 256)
        return data.decode("utf-8", errors="replace")


class HFTokenizer:
    """Adapts a transformers tokenizer to the interface above."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.vocab_size = len(tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """Token ids of one conversation in the model's chat format, ending with the cue for the
        assistant's turn (the template adds BOS and the special tokens itself: no ``encode`` after)."""
        return list(
            self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
