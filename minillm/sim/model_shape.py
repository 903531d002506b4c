"""What the simulator needs from a model without its weights: its shape.

A profile names its model by the shape fields of a transformers config. From those the simulator
builds minillm's ``CausalLM`` on PyTorch's ``meta`` device -- parameters with shapes and no memory --
which is enough to build the real engine around it and to count what the cost model needs.
"""

from __future__ import annotations

import json
from functools import lru_cache

import torch

from minillm.models.llama import CausalLM, ModelConfig

# The transformers config fields that set the cost of a forward pass and the longest sequence.
SHAPE_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "tie_word_embeddings",
)


def model_shape(hf_config) -> dict:
    """The shape fields of a transformers config, as a profile stores them."""
    return {k: getattr(hf_config, k) for k in SHAPE_FIELDS}


def weightless_model(shape: dict, dtype: torch.dtype = torch.float32) -> CausalLM:
    """minillm's model of this shape on the ``meta`` device: no memory, no weights. ``dtype`` is the
    one it is stored in, which is what a KV memory budget is priced in."""
    return _weightless_model(json.dumps(shape, sort_keys=True), dtype)


@lru_cache(maxsize=8)
def _weightless_model(shape_json: str, dtype: torch.dtype) -> CausalLM:
    from transformers import AutoConfig

    shape = json.loads(shape_json)
    config = AutoConfig.for_model(**shape)
    with torch.device("meta"):
        return CausalLM(ModelConfig.from_hf(config)).to(dtype)


def model_numbers(model: CausalLM, dtype_bytes: int) -> dict:
    """A profile's per-model numbers for ``model`` stored with ``dtype_bytes`` bytes per value."""
    cfg = model.config
    num_params = sum(p.numel() for p in model.parameters())  # tied embeddings count once
    return {
        "num_params": num_params,
        "weight_bytes": num_params * dtype_bytes,
        "kv_bytes_per_token": 2
        * cfg.num_hidden_layers
        * cfg.num_key_value_heads
        * cfg.head_dim
        * dtype_bytes,  # k and v
        "attention_flops_per_pair": 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim,  # q.k and p.v
    }


def profile_for_model(device, shape: dict, name: str, dtype_bytes: int = 2):
    """``device`` (a ``Profile``: its bandwidth, FLOP/s and host overheads) running another model,
    given by its shape: the per-model numbers counted from that shape (``model_numbers``)."""
    import dataclasses

    numbers = model_numbers(weightless_model(shape), dtype_bytes)
    notes = f"{device.notes} Model swapped for {name} (counted from its shape: minillm.sim.model_shape)."
    return dataclasses.replace(device, name=name, model=dict(shape), notes=notes, calibration_points=[], **numbers)
