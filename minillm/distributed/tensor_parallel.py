"""Tensor parallelism: each rank holds a slice of every layer, and the ranks add up their parts.

Megatron-LM's split [megatron-lm] pairs the matmuls of a block so that one all-reduce per pair is
the only communication:

* the first matmul of a pair is **column-parallel**: rank r keeps rows of W (output features) for
  its own heads (q, k, v) or its own intermediate channels (gate, up). Attention and SwiGLU work on
  each head, each channel, separately, so a rank computes its share with no help.
* the second is **row-parallel** (``RowParallelLinear``, vLLM's name): rank r keeps the columns of
  W (input features) that match its heads or channels, so its product is a partial sum of the full
  output; an all-reduce adds the ranks' partial sums, and every rank holds the full output again.

So each decoder layer costs two all-reduces of ``[num_tokens, hidden_size]`` (after o_proj and after
down_proj), and each rank keeps 1/N of the layers' weights and 1/N of the KV cache (its KV heads).
The embeddings, norms and LM head stay whole on every rank here (vLLM also splits the vocabulary).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from minillm.models.llama import CausalLM, ModelConfig, rope_cos_sin_cache

# weight name (without "model.layers.N.") -> which dimension of the weight is cut, and by what
COLUMN_PARALLEL = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")


def check_tensor_parallel_size(tensor_parallel_size) -> None:
    """By value, before anything loads: an integer >= 1."""
    if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {tensor_parallel_size!r}")


def check_divides(cfg: ModelConfig, tensor_parallel_size: int) -> None:
    """Every rank gets whole heads and an equal share of the MLP's channels, or the model cannot be split."""
    for field in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(cfg, field)
        if value % tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size={tensor_parallel_size} must divide the model's {field} ({value}); "
                f"sizes that divide it: {[n for n in range(1, value + 1) if value % n == 0][:8]}"
            )


def shard_config(cfg: ModelConfig, tensor_parallel_size: int) -> ModelConfig:
    """The shape one rank sees: its heads and its intermediate channels; the hidden size stays whole."""
    check_divides(cfg, tensor_parallel_size)
    return dataclasses.replace(
        cfg,
        num_attention_heads=cfg.num_attention_heads // tensor_parallel_size,
        num_key_value_heads=cfg.num_key_value_heads // tensor_parallel_size,
        intermediate_size=cfg.intermediate_size // tensor_parallel_size,
    )


def shard_state_dict(model: CausalLM, rank: int, tensor_parallel_size: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s weights: its slice of every column- and row-parallel matrix (a copy), the
    rest as they are (the same tensors, not copies).

    Slices are contiguous: rank r of N keeps q heads [r*H/N, (r+1)*H/N) and KV heads
    [r*K/N, (r+1)*K/N), which are exactly the KV heads its q heads read under grouped-query attention."""
    shard = {}
    for name, tensor in model.state_dict().items():
        part = name.split(".", 3)[-1].rsplit(".", 1)[0]  # "model.layers.3.mlp.up_proj.weight" -> "mlp.up_proj"
        if part in COLUMN_PARALLEL:  # weight [out, in] and bias [out]: cut the outputs
            tensor = tensor.chunk(tensor_parallel_size, dim=0)[rank].clone()
        elif part in ROW_PARALLEL and name.endswith("weight"):  # weight [out, in]: cut the inputs
            tensor = tensor.chunk(tensor_parallel_size, dim=1)[rank].contiguous()
        shard[name] = tensor  # a row-parallel bias is added once, after the sum
    return shard


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_r @ W_r^T) + b``: this rank's input features times its columns of W is a
    partial sum of the full output; the all-reduce adds every rank's part, so each rank leaves with
    the whole ``y`` (the bias is added once, after the sum)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        self.group.allreduce([y]).wait()  # the layer's one communication: every rank waits here
        return y if self.bias is None else y + self.bias


def build_shard(cfg: ModelConfig, state: dict[str, torch.Tensor], eos_token_ids, tensor_parallel_size: int, group):
    """Rank ``group.rank()``'s model: ``cfg``'s architecture with this rank's heads and channels,
    ``state`` from ``shard_state_dict``, and row-parallel layers that all-reduce through ``group``."""
    local = shard_config(cfg, tensor_parallel_size)
    with torch.device("meta"):
        model = CausalLM(local)
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    with torch.device("cpu"):
        cache = rope_cos_sin_cache(local)
    model.model.rotary_emb.cos_sin_cache = cache.to(model.model.embed_tokens.weight.device)
    for layer in model.model.layers:
        for parent, name in ((layer.self_attn, "o_proj"), (layer.mlp, "down_proj")):
            linear = getattr(parent, name)
            setattr(parent, name, RowParallelLinear(linear.weight, linear.bias, group))
    on_meta = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if on_meta:
        raise RuntimeError(f"rank {group.rank()}'s shard has tensors without values: {on_meta}")
    model.eos_token_ids = tuple(eos_token_ids)
    return model.eval()
