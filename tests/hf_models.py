"""Tiny random Hugging Face models and tokenizers, built in code (no network): the oracle's side of
the parity tests, and the chat model the chat tests serve."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

VOCAB = 128

SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.1,  # larger than the default 0.02, so logits are far from uniform
    bos_token_id=None,
    eos_token_id=None,  # greedy runs go the full length in HF too
    pad_token_id=None,
)

FAMILIES = {
    "llama": lambda: LlamaConfig(**SMALL),
    "llama3": lambda: LlamaConfig(
        **SMALL,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,  # < max_position_embeddings, as in real Llama 3
        },
    ),
    "llama-biases": lambda: LlamaConfig(**SMALL, attention_bias=True, mlp_bias=True),  # o_proj has a bias too
    "mistral": lambda: MistralConfig(**SMALL, sliding_window=None),
    "qwen2": lambda: Qwen2Config(**SMALL),  # q/k/v biases
    "qwen3": lambda: Qwen3Config(**SMALL, head_dim=32),  # q/k norms; head_dim != hidden / heads
    "smollm2": lambda: LlamaConfig(**SMALL, tie_word_embeddings=True),
}


def make_hf_model(family: str, dtype=torch.float32):
    """A random HF model with every parameter informative: biases and norm weights are perturbed
    too, since all-zero biases and all-one norms would hide a missing or swapped parameter."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(FAMILIES[family]()).to(dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer built in code (no download): 'w0' .. 'w125', <unk> and <eos>."""
    vocab = {f"w{i}": i for i in range(VOCAB - 2)} | {"<unk>": VOCAB - 2, "<eos>": VOCAB - 1}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


ROLES = ("system", "user", "assistant")
# Every message is "<|role|> content <eos>"; the generation prompt opens the assistant's turn.
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level: 'w0' .. 'w122', one token per role marker, <unk> and <eos> (id VOCAB - 1)."""
    words = VOCAB - 2 - len(ROLES)
    vocab = {f"w{i}": i for i in range(words)} | {f"<|{r}|>": words + k for k, r in enumerate(ROLES)}
    vocab |= {"<unk>": VOCAB - 2, "<eos>": VOCAB - 1}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", chat_template=TEMPLATE)


def save_chat_llama(path) -> None:
    """A tiny random Llama with ``chat_tokenizer`` (and so a chat template), saved as a checkpoint."""
    make_hf_model("llama").save_pretrained(path)
    chat_tokenizer().save_pretrained(path)
