"""A Triton kernel for attention over a paged KV cache, written for chapter 5 after studying the idea of
vLLM's unified Triton attention (our own code).

The idea: one program per (query tile, KV head). A query tile holds up to ``BLOCK_Q`` consecutive query
tokens of ONE sequence times the ``G`` query heads that share the KV head, so GQA reads each K/V tile
once for the whole group. The program walks the sequence's keys ``TILE_N`` at a time, translating each
logical position into (physical block, offset) through the block table, and keeps an online softmax
(running max ``m``, running sum ``l``) in float32, so the scores are never materialised. Causality is a
comparison of positions: query ``j`` of a sequence with ``q_len`` queries sits at ``seq_len - q_len + j``.

The grid is sized without reading any tensor on the host (no GPU sync): sequence ``i``'s tiles are
numbered from ``query_start_loc[i] // BLOCK_Q + i``, an upper bound that leaves a few idle programs;
each program finds its sequence by binary search over ``query_start_loc``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    scale_log2,  # softmax scale * log2(e): the kernel uses exp2
    num_seqs,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    G: tl.constexpr,  # query heads per KV head
    G_PAD: tl.constexpr,  # G rounded up to a power of two (tile rows must be a power of two)
    BLOCK_Q: tl.constexpr,  # query tokens per tile; BLOCK_Q * G_PAD rows
    BLOCK_SIZE: tl.constexpr,  # KV cache block size
    TILE_N: tl.constexpr,  # keys per step (>= 16, may span several cache blocks)
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,  # "ieee" for float32 (matches the reference), "tf32" ignored for 16-bit
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)

    # which sequence owns tile ``pid``: the last i with query_start_loc[i] // BLOCK_Q + i <= pid
    lo = 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= pid:
            lo = mid
        else:
            hi = mid - 1
    seq = lo
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tile = pid - (q_start // BLOCK_Q + seq)
    if tile * BLOCK_Q >= q_len:
        return  # a spare program of the upper-bound grid
    seq_len = tl.load(seq_lens_ptr + seq)

    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    rows = tl.arange(0, BLOCK_M)
    q_local = tile * BLOCK_Q + rows // G_PAD  # query index within the sequence
    head = kv_head * G + rows % G_PAD
    row_ok = (q_local < q_len) & (rows % G_PAD < G)
    q_pos = seq_len - q_len + q_local  # causal position of each row's query
    dims = tl.arange(0, HEAD_DIM)

    q_offs = (q_start + q_local)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0)

    m = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite, so fully masked rows give exp2(-inf) = 0, not NaN
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # keys beyond the tile's last query are never seen: stop there
    last_pos = seq_len - q_len + tl.minimum((tile + 1) * BLOCK_Q, q_len) - 1
    num_tiles = tl.cdiv(last_pos + 1, TILE_N)
    for n in range(0, num_tiles):
        k_pos = n * TILE_N + tl.arange(0, TILE_N)
        k_ok = k_pos < seq_len
        physical = tl.load(block_tables_ptr + seq * stride_bt + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        slot = k_pos % BLOCK_SIZE
        k_offs = physical[:, None] * stride_kb + slot[:, None] * stride_ks + kv_head * stride_kh + dims[None, :]
        v_offs = physical[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh + dims[None, :]
        k = tl.load(k_ptr + k_offs, mask=k_ok[:, None], other=0.0)
        v = tl.load(v_ptr + v_offs, mask=k_ok[:, None], other=0.0)

        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [BLOCK_M, TILE_N], log2 units
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)  # rescales what was accumulated under the old max
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    o_offs = (q_start + q_local)[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def triton_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out=None):
    """Launch the kernel; arguments as ``paged_attention`` (which checks them). ``out`` may be given
    (the tests poison it with NaN to catch rows the kernel never writes)."""
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = block_tables.shape[0]
    # The kernel reads and writes the head dimension with stride 1; ``out`` is made after ``q`` is
    # contiguous, since empty_like keeps a strided q's layout.
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
    if out is None:
        out = torch.empty_like(q)
    if num_tokens == 0 or num_seqs == 0:
        return out
    tiles = tile_config(num_heads, num_kv_heads, head_dim, block_size, decode_only=num_tokens == num_seqs)
    grid = (num_tokens // tiles["BLOCK_Q"] + num_seqs, num_kv_heads)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        seq_lens,
        query_start_loc,
        scale * 1.4426950408889634,
        num_seqs,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        **tiles,
        PRECISION=precision(q.dtype),
    )
    return out


def tile_config(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, decode_only: bool) -> dict:
    """The kernel's compile-time sizes for a model's heads and a step's kind (``minillm.kernels.aot``
    compiles the same ones for GPUs this machine does not have)."""
    g = num_heads // num_kv_heads
    g_pad = triton.next_power_of_2(g)
    # decode-only steps (one query per sequence) want few rows per tile; prefill chunks want more
    block_m = max(16, g_pad) if decode_only else max(64, g_pad)
    tile_n = max(32, block_size) if head_dim <= 64 else max(16, block_size)
    return dict(G=g, G_PAD=g_pad, BLOCK_Q=block_m // g_pad, BLOCK_SIZE=block_size, TILE_N=tile_n, HEAD_DIM=head_dim)


def precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s precision: IEEE float32 (as the reference computes) or 16-bit inputs (tf32 is ignored)."""
    return "ieee" if dtype == torch.float32 else "tf32"
