"""A compact Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM2).

The model never stores keys and values itself: every attention layer hands its new q, k, v to an
*attention backend* (``kv_cache.attend(layer_idx, q, k, v)``; the contract is
``minillm.attention.AttentionBackend``), which writes them into whatever KV
layout the current chapter uses and returns the attention output. Swapping the backend is how the
course moves from a contiguous cache (chapter 1) to padded batches, ragged batches and paged blocks
without touching this file.

Shapes are layout-agnostic: ``input_ids`` and ``positions`` may be ``[T]`` (one flat token batch) or
``[B, T]`` (a padded batch); every layer keeps those leading dimensions.

Module and parameter names match Hugging Face's, so a transformers state dict loads as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minillm.attention.causal import causal_attention

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class ModelConfig:
    """The few numbers that define the architecture, read from a transformers config."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # None for plain RoPE, else the Llama 3 scaling parameters
    qkv_bias: bool  # Qwen2 always; Llama and Qwen3 when the config says attention_bias
    o_proj_bias: bool  # Llama and Qwen3 with attention_bias (Qwen2 keeps o_proj bias-free)
    mlp_bias: bool  # only Llama configs can ask for it
    qk_norm: bool  # Qwen3 normalises q and k per head
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, hf_config) -> ModelConfig:
        model_type = getattr(hf_config, "model_type", type(hf_config).__name__)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported by minillm; supported model types: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)} (Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM2)"
            )
        rope = dict(getattr(hf_config, "rope_parameters", None) or {})
        rope_type = rope.get("rope_type", "default")
        if rope_type not in ("default", "llama3"):
            raise ValueError(
                f"rope_type {rope_type!r} of this {model_type} checkpoint is not supported; "
                "minillm implements 'default' and 'llama3' RoPE"
            )
        heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        max_pos = hf_config.max_position_embeddings
        # Only Llama and Qwen3 read attention_bias; Mistral and Qwen2 hard-code their biases.
        attention_bias = model_type in ("llama", "qwen3") and bool(getattr(hf_config, "attention_bias", False))
        if getattr(hf_config, "sliding_window", None) and getattr(hf_config, "use_sliding_window", True):
            # minillm attends over the whole context, so it stays inside the window to stay exact.
            max_pos = min(max_pos, hf_config.sliding_window)
        return cls(
            model_type=model_type,
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_hidden_layers=hf_config.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            max_position_embeddings=max_pos,
            rms_norm_eps=hf_config.rms_norm_eps,
            rope_theta=rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)),
            rope_scaling=rope if rope_type == "llama3" else None,
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_proj_bias=attention_bias,
            mlp_bias=model_type == "llama" and bool(getattr(hf_config, "mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight over the last dimension, computed in float32 as the reference implementations do."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Rotation speed of each pair of channels; Llama 3 slows down the long-wavelength ones."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    if cfg.rope_scaling is None:
        return inv_freq
    s = cfg.rope_scaling
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    # Between the two wavelength limits, blend the scaled and unscaled frequencies smoothly.
    smooth = ((old_ctx / wavelen) - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, blended)
    return torch.where(wavelen < old_ctx / high, inv_freq, scaled)


def rope_cos_sin_cache(cfg: ModelConfig) -> torch.Tensor:
    """``[max_pos, D]``: cos then sin of every position's angles, in float32, on torch's current
    default device. Not part of a checkpoint: a model built on the meta device recomputes it."""
    positions = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
    freqs = torch.outer(positions, rope_inv_freq(cfg))  # [max_pos, D/2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotates q and k by an angle proportional to each token's position.

    The cos and sin of every position are computed once, in float32, and only the results are cast
    to the model's dtype (vLLM's ``cos_sin_cache``). Casting the rotation speeds to bfloat16 instead
    would make the angle of position 5,000 wrong by whole radians.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.register_buffer("cos_sin_cache", rope_cos_sin_cache(cfg), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions``: integers in ``[0, max_position_embeddings)``, any leading shape."""
        cos_sin = self.cos_sin_cache[positions].unsqueeze(-2)  # [..., T, 1, D]: broadcast over heads
        return cos_sin.chunk(2, dim=-1)  # cos, sin: [..., T, 1, D/2] each


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each channel pair (i, i + D/2) by its angle: the "neox" layout HF's Llama uses."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        h, bias = cfg.hidden_size, cfg.qkv_bias
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=cfg.o_proj_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, cos, sin, kv_cache):
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv_cache is None:
            out = causal_attention(q, k, v)
        else:
            out = kv_cache.attend(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(*lead, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kv_cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    """Embeddings, decoder layers and final norm: everything up to the hidden states."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg)

    def forward(self, input_ids, positions, kv_cache=None):
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(positions)
        for layer in self.layers:
            x = layer(x, cos, sin, kv_cache)
        return self.norm(x)


class CausalLM(nn.Module):
    """The decoder plus the LM head. ``forward`` returns hidden states; ``compute_logits`` maps the
    rows the caller picks (usually one per sequence) to vocabulary logits, so a prefill of 1,000
    tokens does not pay for 1,000 rows of logits it throws away."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.eos_token_ids: tuple[int, ...] = ()  # the checkpoint's end-of-sequence ids; the loader sets them
        self.model = DecoderModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache=None) -> torch.Tensor:
        return self.model(input_ids, positions, kv_cache)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden_states)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32, fp64 stays
