"""Chapter 9's C ops for PyTorch tensors: the work between a layer's matmuls in one pass each
(``csrc/fused_ops.c``: vLLM's ``rms_norm``, ``fused_add_rms_norm``, ``rotary_embedding`` and
``silu_and_mul``), and the matmul of a step with only a few tokens (``csrc/linear_few_rows.c``).
float32 CPU tensors; the library is built by ``cpu_build``. Each C function reads raw memory, so
every wrapper hands it contiguous rows."""

from __future__ import annotations

import torch

from minillm.kernels import cpu_build


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dimension."""
    x = x.contiguous()
    out = torch.empty_like(x)
    cpu_build.library().rms_norm(out.data_ptr(), x.data_ptr(), weight.data_ptr(), _rows(x), x.shape[-1], eps)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``residual += x`` in place (``residual`` must be contiguous), then returns ``rms_norm(residual)``."""
    if not residual.is_contiguous():
        raise ValueError("add_rms_norm updates residual in place: it must be contiguous")
    x = x.contiguous()
    out = torch.empty_like(x)
    cpu_build.library().add_rms_norm(
        out.data_ptr(), residual.data_ptr(), x.data_ptr(), weight.data_ptr(), _rows(x), x.shape[-1], eps
    )
    return out


def rotary_embedding_(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[num_tokens, num_heads, head_dim]`` in place by each token's position (the neox
    pairing of ``minillm.models.llama.apply_rope``); ``cos_sin_cache`` ``[max_positions, head_dim]``.
    ``x`` may be a view whose tokens are further apart than its heads (q and k inside the fused qkv
    matmul's output), as long as each token's heads lie together."""
    num_tokens, num_heads, head_dim = x.shape
    if x.stride(2) != 1 or x.stride(1) != head_dim:
        raise ValueError(f"rotary_embedding_ needs each token's heads contiguous, got strides {x.stride()}")
    positions = positions.to(torch.int64).contiguous()
    cpu_build.library().rotary_embedding(
        x.data_ptr(), num_tokens, x.stride(0), num_heads, head_dim, positions.data_ptr(), cos_sin_cache.data_ptr()
    )
    return x


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate_up``'s last dimension is the gate's values, then up's."""
    gate_up = gate_up.contiguous()
    out = gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
    cpu_build.library().silu_and_mul(out.data_ptr(), gate_up.data_ptr(), _rows(gate_up), out.shape[-1])
    return out


def linear_few_rows(x: torch.Tensor, parts) -> torch.Tensor:
    """``x`` ``[rows, k]`` times the weights of ``parts``, a list of (weight ``[n_i, k]``, bias or None)
    of layers reading the same input: returns ``[rows, sum n_i]``, each part's outputs in its columns
    (so q, k and v come out as one fused matmul's would, from the model's own separate weights)."""
    x = x.contiguous()
    out = x.new_empty(x.shape[0], sum(w.shape[0] for w, _ in parts))
    lib, column = cpu_build.library(), 0
    for weight, bias in parts:
        y = out[:, column:]  # its first n_i columns; the kernel writes only those
        bias_ptr = None if bias is None else bias.data_ptr()
        rows, n, k = x.shape[0], weight.shape[0], x.shape[1]
        lib.linear_few_rows(y.data_ptr(), out.shape[1], x.data_ptr(), weight.data_ptr(), bias_ptr, rows, n, k)
        column += weight.shape[0]
    return out
