"""The launchers of chapter 5's kernel puzzles: one for the learner's notebook and the grader alike.

A puzzle's answer is the body of a ``@triton.jit`` kernel, so the code around it -- the grid, the
pointers, the strides, the sizes -- is the course's, here: the exercise file's launchers call these
with the learner's kernels, and the grading tests call them with the same kernels directly, so a
launcher that computed the answer some other way would change nothing the grader sees.
"""

from __future__ import annotations

import functools

import torch

from minillm.attention.paged_kv import PagedKVCache
from minillm.engines.paged import PagedRunner


def launch_one_block(kernel, q, k_cache, v_cache, block_id: int, scale: float, out=None) -> torch.Tensor:
    """Puzzle 1: run ``kernel`` on q ``[num_heads, head_dim]`` over pools ``[num_blocks, block_size,
    num_kv_heads, head_dim]``, one program per query head; returns ``[num_heads, head_dim]`` (into
    ``out`` when given)."""
    num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    check_shapes(head_dim, k_cache, v_cache, num_heads)
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    out = torch.empty_like(q) if out is None else out
    launch(
        kernel,
        (num_heads,),
        q,
        k_cache,
        v_cache,
        out,
        int(block_id),
        float(scale),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        GROUP=num_heads // num_kv_heads,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
    )
    return out


def launch_paged_decode(kernel, q, k_cache, v_cache, block_tables, seq_lens, scale: float, out=None) -> torch.Tensor:
    """Puzzle 2: run ``kernel`` on q ``[num_seqs, num_heads, head_dim]`` (one decode query per
    sequence), the pools, ``block_tables`` ``[num_seqs, max_blocks]`` and ``seq_lens`` ``[num_seqs]``
    (made int32 here), one program per (sequence, query head); returns ``[num_seqs, num_heads,
    head_dim]`` (into ``out`` when given)."""
    num_seqs, num_heads, head_dim = q.shape
    check_shapes(head_dim, k_cache, v_cache, num_heads)
    if block_tables.shape[0] != num_seqs or seq_lens.shape != (num_seqs,):
        raise ValueError(
            f"block_tables must be [num_seqs={num_seqs}, max_blocks] and seq_lens [num_seqs], "
            f"got {tuple(block_tables.shape)} and {tuple(seq_lens.shape)}"
        )
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    block_tables, seq_lens = as_int32(block_tables, seq_lens)
    out = torch.empty_like(q) if out is None else out
    if num_seqs == 0:
        return out
    launch_paged(kernel, (num_seqs, num_heads), q, k_cache, v_cache, out, block_tables, seq_lens, scale=scale)
    return out


def launch_ragged(
    kernel, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale: float, out=None
) -> torch.Tensor:
    """Puzzle 3: run ``kernel`` on a ragged batch, ``paged_attention_reference``'s arguments: q
    ``[num_tokens, num_heads, head_dim]``, ``query_start_loc`` ``[num_seqs + 1]``; one program per
    (sequence, query, head), the grid as long as the longest sequence's queries. Returns ``[num_tokens,
    num_heads, head_dim]`` (into ``out`` when given)."""
    num_tokens, num_heads, head_dim = q.shape
    check_shapes(head_dim, k_cache, v_cache, num_heads)
    num_seqs = seq_lens.shape[0]
    if block_tables.shape[0] != num_seqs or query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(
            f"block_tables must be [num_seqs={num_seqs}, max_blocks] and query_start_loc [num_seqs + 1], "
            f"got {tuple(block_tables.shape)} and {tuple(query_start_loc.shape)}"
        )
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    block_tables, seq_lens, query_start_loc = as_int32(block_tables, seq_lens, query_start_loc)
    out = torch.empty_like(q) if out is None else out
    if num_seqs == 0 or num_tokens == 0:
        return out
    max_q_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    grid = (num_seqs, max_q_len, num_heads)
    launch_paged(kernel, grid, q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc, scale=scale)
    return out


def as_int32(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Block tables, lengths and offsets as the kernels index them: contiguous int32."""
    return [t.to(torch.int32).contiguous() for t in tensors]


def launch_paged(kernel, grid, q, k_cache, v_cache, out, block_tables, *per_seq, scale: float) -> None:
    """The launch puzzles 2 and 3 share: the tensors, then the scale, the number of query heads,
    the block tables' and the pools' strides, and the sizes as constants."""
    num_heads = q.shape[1]
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    launch(
        kernel,
        grid,
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        *per_seq,
        float(scale),
        num_heads,
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        GROUP=num_heads // num_kv_heads,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
    )


def check_shapes(head_dim, k_cache, v_cache, num_heads) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[-1] != head_dim:
        raise ValueError(
            f"k_cache and v_cache must be [num_blocks, block_size, num_kv_heads, head_dim={head_dim}], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    for name, n in (("block_size", block_size), ("head_dim", head_dim)):
        if n < 1 or n & (n - 1):
            raise ValueError(f"{name} must be a power of two (tl.arange needs one), got {n}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")


def launch(kernel, grid, *args, **constexprs) -> None:
    """Run ``kernel[grid](...)``. Triton reports an error inside a kernel as its own error (the
    interpreter's ``InterpreterError``, a GPU's ``CompilationError``): a ``raise NotImplementedError``
    left in a kernel comes back out as ``NotImplementedError``, so the grader says "not implemented
    yet"; any other error of the interpreter comes back as the error the kernel raised."""
    try:
        kernel[grid](*args, **constexprs)
    except Exception as err:
        cause = err
        while cause.__cause__ is not None and type(cause).__name__ == "InterpreterError":
            cause = cause.__cause__
        if isinstance(cause, NotImplementedError):
            raise cause from None
        if "NotImplementedError" in str(err) and "Raise" in str(err):  # compiled for a GPU: `raise` cannot be
            raise NotImplementedError(f"{kernel.__name__} still raises NotImplementedError: write its body") from None
        if cause is not err:
            raise cause from None
        raise


class DecodeKernelCache(PagedKVCache):
    """The paged engine's attention backend, except that a decode-only step (one query per sequence)
    attends with ``kernel`` through ``launch_paged_decode``; steps with a prefill keep the engine's."""

    def __init__(self, *args, kernel, calls: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.kernel, self.calls = kernel, calls  # calls: {"yours": ..., "engine": ...}, layer calls each way

    def paged_attention(self, q, k_cache, v_cache):
        decode_only = q.shape[0] == self.seq_lens.shape[0]
        self.calls["yours" if decode_only else "engine"] += 1
        if not decode_only:
            return super().paged_attention(q, k_cache, v_cache)
        return launch_paged_decode(self.kernel, q, k_cache, v_cache, self.block_tables, self.seq_lens, self.scale)


class RaggedKernelCache(PagedKVCache):
    """The paged engine's attention backend with ``kernel`` (puzzle 3's) in every step."""

    def __init__(self, *args, kernel, calls: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.kernel, self.calls = kernel, calls

    def paged_attention(self, q, k_cache, v_cache):
        self.calls["yours"] += 1
        return launch_ragged(
            self.kernel, q, k_cache, v_cache, self.block_tables, self.seq_lens, self.query_start_loc, self.scale
        )


def ragged_kernel_runner(kernel) -> type[PagedRunner]:
    """A paged runner class that attends with ``kernel`` (puzzle 3's) in every step, prefills
    included; its ``kernel_calls`` counts the layer calls."""

    class RaggedKernelRunner(PagedRunner):
        def __init__(self, model, device, **options):
            super().__init__(model, device, **options)
            self.kernel_calls = {"yours": 0, "engine": 0}
            self.kv_cache_cls = functools.partial(RaggedKernelCache, kernel=kernel, calls=self.kernel_calls)

    return RaggedKernelRunner


def decode_kernel_runner(kernel) -> type[PagedRunner]:
    """A paged runner class that attends with ``kernel`` (puzzle 2's) in every decode-only step;
    its ``kernel_calls`` counts the layer calls each way."""

    class DecodeKernelRunner(PagedRunner):
        def __init__(self, model, device, **options):
            super().__init__(model, device, **options)
            self.kernel_calls = {"yours": 0, "engine": 0}
            self.kv_cache_cls = functools.partial(DecodeKernelCache, kernel=kernel, calls=self.kernel_calls)

    return DecodeKernelRunner
