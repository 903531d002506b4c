"""Where weights come from: the built-in ``"tiny"`` model, a hub name, a local path, or a
transformers model object already in memory. All four end the same way: a transformers state dict
copied into minillm's own ``CausalLM``."""

from __future__ import annotations

import os

import torch

from minillm.model import CausalLM, ModelConfig
from minillm.tokenizer import ByteTokenizer, HFTokenizer

TINY = "tiny"

# Hub names the course suggests; any other checkpoint of a supported family works too.
SUGGESTED_MODELS = {
    "cpu": "HuggingFaceTB/SmolLM2-135M",
    "gpu": "Qwen/Qwen3-0.6B",
}


def tiny_hf_config():
    """A small Llama: 4 layers, hidden 256, grouped-query attention, byte-level vocabulary."""
    from transformers import LlamaConfig

    tok = ByteTokenizer()
    return LlamaConfig(
        vocab_size=tok.vocab_size,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )


def load_hf_model(model, dtype: torch.dtype):
    """Return ``(transformers model, tokenizer or None)`` for any accepted ``model`` argument."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM, PreTrainedModel

    if isinstance(model, PreTrainedModel):
        ModelConfig.from_hf(model.config)  # fail early on an unsupported family
        return model, None
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError(f"model must be 'tiny', a hub name, a local path or a transformers model, got {type(model).__name__}")
    name = str(model)
    if name == TINY:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # the same random weights on every machine
            return LlamaForCausalLM(tiny_hf_config()), ByteTokenizer()
    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as err:
        where = "local path" if os.path.exists(name) else "hub name"
        raise ValueError(
            f"model {name!r} could not be loaded as a {where} ({type(err).__name__}: {err}). "
            "Without network access, use the built-in offline model: LLM('tiny')."
        ) from err
    ModelConfig.from_hf(config)  # before downloading gigabytes of an unsupported model
    from transformers import AutoTokenizer

    hf_model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    return hf_model, HFTokenizer(AutoTokenizer.from_pretrained(name))


def load_model(model, dtype: torch.dtype, device: torch.device):
    """Build minillm's ``CausalLM`` with the weights of ``model``; returns ``(model, tokenizer)``."""
    hf_model, tokenizer = load_hf_model(model, dtype)
    cfg = ModelConfig.from_hf(hf_model.config)
    ours = CausalLM(cfg).to(dtype)
    state = {k: v for k, v in hf_model.state_dict().items() if "rotary_emb" not in k}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = ours.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights do not match minillm's {cfg.model_type} model: missing {missing}, unexpected {unexpected}")
    return ours.to(device).eval(), tokenizer
