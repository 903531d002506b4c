"""Chapter 9's fast path on a GPU: the work between a layer's matmuls, written in PyTorch and compiled
by ``torch.compile``. The same four ops, with the same contracts, as the CPU's C functions
(``cpu_ops``): RMSNorm, the skip connection added inside the next norm, the rotary embedding in
place, SiLU-and-multiply.

Run eagerly, each of them is several kernels (RMSNorm alone is six: a square, a mean, an add, a
reciprocal square root, two products), each reading and writing the whole activation; on a GPU a
decode step's activations are small, so each kernel costs its launch more than its work, and a CUDA
graph removes the launches but not the kernels. The compiler (inductor) writes one kernel per op
instead (Triton on a GPU, C++ on a CPU). The matmuls stay cuBLAS's (or oneDNN's) and attention stays
the engine's: only these functions are compiled, so nothing the compiler cannot trace reaches it.

Each op is compiled on its first call, with the sizes left symbolic (``dynamic=True``): twice, for one
token and for any other count (torch specializes a dimension of size 1), not once per step size; the
fast path's model makes those calls when it is built (``FastCausalLM``), so no step waits for the
compiler (``tests/test_compiled_ops.py`` counts the compilations). Inductor keeps what it generated in
a cache on disk, where the next process finds it.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from minillm.models.llama import apply_rope, rms_norm

BACKEND = "inductor"  # torch.compile's compiler; the tests also trace with "aot_eager", which generates no code


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``residual += x`` in place, then returns ``rms_norm(residual)``."""
    residual.add_(x)
    return rms_norm(residual, weight, eps)


def rotary_embedding_(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[num_tokens, num_heads, head_dim]`` in place by each token's position
    (``cos_sin_cache`` ``[max_positions, head_dim]``: cos then sin)."""
    cos, sin = cos_sin_cache[positions].unsqueeze(-2).chunk(2, dim=-1)
    return x.copy_(apply_rope(x, cos, sin))


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate_up``'s last dimension is the gate's values, then up's."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@functools.cache
def compiled(backend: str) -> SimpleNamespace:
    """The four ops compiled with ``backend`` (each on its first call), under ``cpu_ops``'s names."""
    ops = (rms_norm, add_rms_norm, rotary_embedding_, silu_and_mul)
    return SimpleNamespace(
        **{op.__name__: torch.compile(op, dynamic=True, fullgraph=True, backend=backend) for op in ops}
    )


def ops() -> SimpleNamespace:
    """The ops compiled with ``BACKEND``."""
    return compiled(BACKEND)
