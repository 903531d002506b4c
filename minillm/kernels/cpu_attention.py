"""Chapter 9's CPU attention kernels (``csrc/paged_decode_attention.c`` and
``csrc/paged_prefill_attention.c``), compiled on first use by ``cpu_build``.

On a CPU, the PyTorch backend spends most of a decode step's attention copying: each layer gathers
every decoding request's blocks into one padded tensor, then attends over the copy. The decode
kernel reads each key and value once, in place, through the block table. A prompt's attention is
compute, not copying: PyTorch's flash kernel computes most of the masked half of a causal prompt's
scores too (its key tiles are 512 long); the prefill kernel's tiles of 64 skip it.
"""

from __future__ import annotations

import torch

from minillm.kernels import cpu_build


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale: float) -> torch.Tensor:
    """One query per sequence over its paged context: ``q`` ``[num_seqs, num_heads, head_dim]``, the pools
    ``[num_blocks, block_size, num_kv_heads, head_dim]``, ``block_tables`` ``[num_seqs, max_blocks]`` and
    ``seq_lens`` ``[num_seqs]`` (context including this step's token). float32 CPU tensors, shapes checked
    by the caller (``paged_attention``); returns ``[num_seqs, num_heads, head_dim]``."""
    lib = cpu_build.library()
    # the C loop reads raw memory row by row: contiguous tensors, int32 indices (no copy when already so)
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    block_tables, seq_lens = block_tables.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous()
    num_seqs, num_heads, head_dim = q.shape
    out = torch.empty_like(q)
    failed = lib.paged_decode_attention(
        out.data_ptr(),
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_tables.data_ptr(),
        seq_lens.data_ptr(),
        num_seqs,
        num_heads,
        k_cache.shape[2],
        head_dim,
        k_cache.shape[1],
        block_tables.shape[1],
        scale,
    )
    if failed:
        raise MemoryError("the CPU attention kernel could not allocate its scores buffer")
    return out


def paged_prefill_attention(out, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, seq_ids, scale):
    """Causal attention of the sequences ``seq_ids`` (int32) over their paged context, written into
    their rows of ``out`` (``[num_tokens, num_heads, head_dim]``, like ``q``); the other rows are left
    as they are. The index tensors as in ``paged_decode_attention`` plus ``query_start_loc``
    ``[num_seqs + 1]``, all int32 and contiguous (the plan converts them once a step); float32 CPU
    tensors, shapes checked by the caller."""
    if not out.is_contiguous():
        raise ValueError("paged_prefill_attention writes rows of out in place: it must be contiguous")
    if q.stride(2) != 1 or q.stride(1) != q.shape[2]:  # each token's heads must lie together; tokens may not
        q = q.contiguous()
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    failed = cpu_build.library().paged_prefill_attention(
        out.data_ptr(),
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_tables.data_ptr(),
        seq_lens.data_ptr(),
        query_start_loc.data_ptr(),
        seq_ids.data_ptr(),
        seq_ids.shape[0],
        q.shape[1],
        k_cache.shape[2],
        q.shape[2],
        k_cache.shape[1],
        block_tables.shape[1],
        q.stride(0),
        scale,
    )
    if failed:
        raise MemoryError("the CPU prefill attention kernel could not allocate its buffers")
