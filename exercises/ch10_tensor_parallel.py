# Generated from solutions/ch10_tensor_parallel.py by `minillm make-exercises`. This file is yours:
# replace each `raise NotImplementedError(...)` with your code, then run `minillm grade`.
# make-exercises never overwrites a file you have edited (unless you pass --force).
# generated-sha256: 9378f61134ffbda1
"""Chapter 10, beyond one GPU: the Megatron split of one MLP layer, and its all-reduce.

With tensor parallelism, each of N GPUs (the *ranks*) keeps 1/N of every weight matrix and does 1/N
of every matmul; the ranks then add up their parts. Megatron-LM [megatron-lm] pairs the matmuls of
the MLP so that one addition across the GPUs per layer is all the communication it needs:

* gate_proj and up_proj are *column-parallel*: each rank keeps a slice of their output features, its
  own intermediate channels. SwiGLU works on each channel by itself, so a rank computes
  ``silu(gate) * up`` for its channels with no help from the others.
* down_proj is *row-parallel*: each rank keeps the input features of down_proj that read its own
  channels. Its product has every output feature, but it is only a partial sum of the layer's output.
* an *all-reduce* adds up the ranks' partial sums, and every rank holds the layer's output again.

Here the ranks are a list in one process (rank 0 first), and four functions split the layer and run
it as the ranks would:

* ``split_mlp``: each rank's part of the layer;
* ``shard_forward``: what one rank computes alone;
* ``all_reduce``: what the all-reduce gives every rank;
* ``parallel_mlp``: the layer's output from the ranks' parts.

``check("ch10_tensor_parallel")`` grades them in float64 on small random layers, with and without
biases, against the layer unsplit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minillm.models.llama import MLP


@dataclass
class MLPShard:
    """One rank's part of an MLP layer (given: keep its fields as they are). Weights are laid out as
    ``nn.Linear`` keeps them, ``[out_features, in_features]``; a bias is None where the layer has none.

    * ``gate_weight``, ``up_weight`` (``[intermediate_size / tp_size, hidden_size]``) and
      ``gate_bias``, ``up_bias`` (``[intermediate_size / tp_size]``): the rank's slice of gate_proj's
      and up_proj's output features;
    * ``down_weight`` (``[hidden_size, intermediate_size / tp_size]``): the input features of
      down_proj that read the rank's channels;
    * ``down_bias`` (``[hidden_size]`` or None): down_proj's bias, wherever your design keeps it
      (``split_mlp`` says what it must do).
    """

    gate_weight: torch.Tensor
    up_weight: torch.Tensor
    down_weight: torch.Tensor
    gate_bias: torch.Tensor | None = None
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None


def split_mlp(mlp: MLP, tp_size: int) -> list[MLPShard]:
    """``mlp`` cut into ``tp_size`` shards, rank 0's first. ``mlp`` is minillm's SwiGLU layer
    (``minillm.models.llama.MLP``): ``down_proj(silu(gate_proj(x)) * up_proj(x))``, three
    ``nn.Linear`` layers, each with a bias when the model's config says ``mlp_bias``.

    * Every rank gets an equal share of the intermediate channels, and the shards' ``gate_weight``,
      concatenated in rank order along the output features, is ``mlp.gate_proj.weight``; the same
      for ``up_weight`` and for the biases ``gate_bias`` and ``up_bias`` (None where the layer has none).
    * Each rank's ``down_weight`` holds the input features of ``mlp.down_proj.weight`` that read that
      rank's channels: concatenated in rank order along the input features, they are
      ``mlp.down_proj.weight``.
    * down_proj's bias must reach ``parallel_mlp``'s output exactly once. Which shards keep it (as
      ``down_bias``) and which function adds it is for you to decide, in this function,
      ``shard_forward`` and ``parallel_mlp`` together.
    * When ``tp_size`` does not divide the intermediate size, it raises ``ValueError`` with a message
      that names ``tp_size`` and the intermediate size.
    """
    raise NotImplementedError("write split_mlp to the contract in its docstring")


def shard_forward(shard: MLPShard, x: torch.Tensor) -> torch.Tensor:
    """What the rank that holds ``shard`` computes alone, with no communication, from the whole
    input ``x`` (``[num_tokens, hidden_size]``): its partial output, ``[num_tokens, hidden_size]``.

    Over the shards of one split, the partials add up to the layer's output, all but down_proj's
    bias, unless your design adds that bias in a partial. Rank r's partial depends only on ``x``
    and on rank r's own shard."""
    raise NotImplementedError("write shard_forward: one rank's partial output, with no communication")


def all_reduce(partials: list[torch.Tensor]) -> torch.Tensor:
    """What an all-reduce of ``partials`` (one tensor per rank, rank 0's first, all of one shape)
    gives every rank: one tensor of that shape, their elementwise sum.

    (Across GPUs, NCCL adds the ranks' tensors in a ring of steps, each rank sending a slice of its
    tensor per step; here the ranks are a list in one process.)"""
    raise NotImplementedError("write all_reduce: what every rank gets from an all-reduce")


def parallel_mlp(shards: list[MLPShard], x: torch.Tensor) -> torch.Tensor:
    """The layer's output on ``x`` (``[num_tokens, hidden_size]``) from ``shards`` (``split_mlp``'s,
    rank 0's first): every rank's partial output, all-reduced, and down_proj's bias once.

    ``parallel_mlp(split_mlp(mlp, n), x)`` equals ``mlp(x)`` to float rounding for every ``n`` that
    divides the intermediate size (``n = 1`` too), with biases and without."""
    raise NotImplementedError("write parallel_mlp: the layer's output from the ranks' parts")
