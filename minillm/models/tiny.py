"""``"tiny"``: the course's offline model, a small Llama with random weights and a byte vocabulary.

It is built here, in a twentieth of a second, rather than through transformers: importing
transformers' Llama costs seconds in every new process (each notebook kernel, each chapter's grader),
and the grader builds its own ``"tiny"`` in every run rather than trust a file that learner code could
have written."""

from __future__ import annotations

import torch

from minillm.models.llama import CausalLM, ModelConfig
from minillm.models.tokenizer import ByteTokenizer

SEED = 0  # the same weights on every machine


def tiny_config() -> ModelConfig:
    """4 layers, hidden 256, grouped-query attention (4 query heads, 2 KV heads), 259 byte-level tokens."""
    return ModelConfig(
        model_type="llama",
        vocab_size=ByteTokenizer.vocab_size,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        qkv_bias=False,
        o_proj_bias=False,
        mlp_bias=False,
        qk_norm=False,
        tie_word_embeddings=False,
    )


def tiny_hf_config():
    """The same architecture as a transformers ``LlamaConfig`` (for transformers' side of a comparison)."""
    from transformers import LlamaConfig

    cfg, tok = tiny_config(), ByteTokenizer()
    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )


def tiny_state_dict() -> dict[str, torch.Tensor]:
    """The weights, float32: every matrix drawn from N(0, 0.02), the norms 1, the padding token's
    embedding 0 — what transformers' ``LlamaForCausalLM(tiny_hf_config())`` draws under seed 0, bit
    for bit (tests/test_model.py). To stay in step with its random stream, the draws follow its
    order: the embedding's default N(0, 1) and a uniform draw per layer matrix at construction, which
    its initialisation then redraws; the output projection last."""
    cfg = tiny_config()
    h, mlp = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    layer = {
        "self_attn.q_proj": (q, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q),
        "mlp.gate_proj": (mlp, h),
        "mlp.up_proj": (mlp, h),
        "mlp.down_proj": (h, mlp),
    }
    matrices = {
        f"model.layers.{i}.{name}.weight": shape for i in range(cfg.num_hidden_layers) for name, shape in layer.items()
    }
    g = torch.Generator().manual_seed(SEED)
    embed = torch.empty(cfg.vocab_size, h).normal_(0.0, 1.0, generator=g)
    for rows, cols in matrices.values():  # construction's draws, redrawn below
        torch.empty(rows, cols).uniform_(-(cols**-0.5), cols**-0.5, generator=g)
    state = {"model.embed_tokens.weight": embed.normal_(0.0, 0.02, generator=g)}
    embed[ByteTokenizer.pad_token_id] = 0.0
    state |= {name: torch.empty(shape).normal_(0.0, 0.02, generator=g) for name, shape in matrices.items()}
    lm_head = torch.empty(cfg.vocab_size, h).uniform_(-(h**-0.5), h**-0.5, generator=g)
    state["lm_head.weight"] = lm_head.normal_(0.0, 0.02, generator=g)
    for i in range(cfg.num_hidden_layers):
        state[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(h)
        state[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.ones(h)
    state["model.norm.weight"] = torch.ones(h)
    return state


def build_tiny(dtype: torch.dtype, device: torch.device) -> tuple[CausalLM, ByteTokenizer]:
    """minillm's ``CausalLM`` with tiny's weights, and its byte tokenizer."""
    # Built on the CPU, not on the meta device as loader.load_model builds a checkpoint's model: there
    # the modules' init code runs through torch's Python reference ops, imported on first use (seconds);
    # tiny's init on the CPU takes 30 ms.
    with torch.random.fork_rng(devices=[]):  # that init is overwritten: leave the global random stream be
        model = CausalLM(tiny_config())
    model.load_state_dict(tiny_state_dict())
    model.eos_token_ids = (ByteTokenizer.eos_token_id,)
    return model.to(device=device, dtype=dtype).eval(), ByteTokenizer()
