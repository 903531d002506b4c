"""Chapter 5, the kernel: paged attention in Triton, in three puzzles.

The paged engine keeps each layer's keys and values in two pools
``[num_blocks, block_size, num_kv_heads, head_dim]`` (vLLM's layout), and a sequence's tokens live
in the blocks its *block table* names, in logical order. Attention must read them through that
table. Three puzzles, each one step from the last:

1. ``one_block_attention_kernel``: one query token attends over the ``block_size`` keys of ONE
   physical block. Pointers, strides, a softmax, and GQA's head mapping.
2. ``paged_decode_kernel``: a batch of decodes. Each sequence has one query (its newest token),
   which attends over the sequence's whole context, block by block through the block table, with
   an *online* softmax (a running max and sum), so the scores are never all held at once.
3. ``ragged_paged_kernel``: a whole step, prefill chunks and decodes of many sequences in one launch,
   causal within each sequence. minillm's own kernel, ``minillm/kernels/triton_paged_attention.py``,
   which the notebook shows after this exercise, does the same with tiles of queries and ``tl.dot``.

You write the bodies of the three ``@triton.jit`` kernels; the course launches them
(``minillm/course/kernel_puzzles.py``: the grid, the pointers, the strides and the sizes), for the
launchers below and for the grader alike, so only the kernels' bodies earn marks. On a machine
without a GPU, Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``, set below before
anything imports Triton), on CPU tensors, in float32: slow, but the very same code.

The oracle is ``minillm.kernels.paged_attention.paged_attention_reference``: gather a sequence's
blocks, then a masked softmax in float32. For a decode, each sequence has one query
(``query_start_loc = [0, 1, 2, ..., num_seqs]``) at position ``seq_len - 1``, so it sees all
``seq_len`` keys. ``check("ch05")`` grades the three puzzles against it, then runs your decode
kernel and your ragged kernel inside the paged engine (the runners at the bottom).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # no GPU: Triton can only run kernels in its interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl

from minillm.course.kernel_puzzles import (
    decode_kernel_runner,
    launch_one_block,
    launch_paged_decode,
    launch_ragged,
    ragged_kernel_runner,
)


# --- puzzle 1: one query, one block ---------------------------------------------------------------
@triton.jit
def one_block_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    block_id,  # the physical block to attend over
    scale,  # multiply the scores q.k by this before the softmax
    stride_block,
    stride_slot,
    stride_head,  # the pools' strides (the same for K and V), in elements
    GROUP: tl.constexpr,  # query heads per KV head: num_heads // num_kv_heads
    BLOCK_SIZE: tl.constexpr,  # keys per block (a power of two)
    HEAD_DIM: tl.constexpr,  # a power of two
):
    """One query token attends over all ``BLOCK_SIZE`` keys of physical block ``block_id``.

    One program per query head ``h = tl.program_id(0)`` (grid ``(num_heads,)``); it computes
    ``out[h] = softmax(scale * q[h] . K^T) V`` over the block's keys, non-causal: the query sits
    after the block, so it sees every key in it.

    * ``q`` and ``out`` are contiguous ``[num_heads, head_dim]``: head ``h``'s vector is the
      ``HEAD_DIM`` elements from ``h * HEAD_DIM``.
    * ``k`` and ``v`` are the pools ``[num_blocks, block_size, num_kv_heads, head_dim]``: element
      ``(b, s, j, d)`` is at ``b * stride_block + s * stride_slot + j * stride_head + d``.
    * GQA: query head ``h`` reads KV head ``h // GROUP`` (heads 0..GROUP-1 share KV head 0, ...).
    * Compute in float32 (``.to(tl.float32)`` after loading); store in ``out``'s dtype.

    Triton note: a broadcast product summed along an axis (``tl.sum``) makes one dot product per row;
    ``tl.dot`` is not needed here.
    """
    # BEGIN SOLUTION
    # HINT: write the body of one_block_attention_kernel
    head = tl.program_id(0)
    kv_head = head // GROUP
    dims = tl.arange(0, HEAD_DIM)
    slots = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + head * HEAD_DIM + dims).to(tl.float32)
    offs = block_id * stride_block + slots[:, None] * stride_slot + kv_head * stride_head + dims[None, :]
    k = tl.load(k_ptr + offs).to(tl.float32)  # [BLOCK_SIZE, HEAD_DIM]
    v = tl.load(v_ptr + offs).to(tl.float32)
    scores = tl.sum(q[None, :] * k, axis=1) * scale  # [BLOCK_SIZE]
    p = tl.exp(scores - tl.max(scores, axis=0))
    out = tl.sum(p[:, None] * v, axis=0) / tl.sum(p, axis=0)
    tl.store(out_ptr + head * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty))
    # END SOLUTION


def one_block_attention(q, k_cache, v_cache, block_id: int, scale: float, out=None) -> torch.Tensor:
    """Given: your ``one_block_attention_kernel`` through the course's launcher (the grader launches it
    the same way). q ``[num_heads, head_dim]``, pools ``[num_blocks, block_size, num_kv_heads,
    head_dim]``; returns ``[num_heads, head_dim]``. ``out`` may be given (the grader fills it with NaN,
    to see rows the kernel never writes)."""
    return launch_one_block(one_block_attention_kernel, q, k_cache, v_cache, block_id, scale, out)


# --- puzzle 2: a batch of decodes over their paged contexts ------------------------------------
@triton.jit
def paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    block_tables_ptr,  # int32 [num_seqs, max_blocks]
    seq_lens_ptr,  # int32 [num_seqs]
    scale,
    num_heads,  # query heads
    stride_table,  # elements between two rows of block_tables (max_blocks)
    stride_block,
    stride_slot,
    stride_head,  # the pools' strides (the same for K and V), in elements
    GROUP: tl.constexpr,  # query heads per KV head: num_heads // num_kv_heads
    BLOCK_SIZE: tl.constexpr,  # keys per block (a power of two)
    HEAD_DIM: tl.constexpr,  # a power of two
):
    """One decode query per sequence attends over the sequence's whole paged context.

    One program per (sequence, query head): ``seq = tl.program_id(0)``, ``head = tl.program_id(1)``
    (grid ``(num_seqs, num_heads)``). Sequence ``seq`` has ``seq_len = seq_lens[seq]`` tokens in the
    cache, its keys at positions ``0 .. seq_len - 1``; its one query (its newest token, at position
    ``seq_len - 1``) sees all of them.

    * ``q`` and ``out`` are contiguous ``[num_seqs, num_heads, head_dim]``: ``q[seq, head]`` is the
      ``HEAD_DIM`` elements from ``(seq * num_heads + head) * HEAD_DIM``.
    * The pools are laid out as in puzzle 1. Logical block ``b`` of the sequence (positions
      ``b * BLOCK_SIZE .. b * BLOCK_SIZE + BLOCK_SIZE - 1``) is PHYSICAL block
      ``block_tables[seq, b]``, at ``block_tables_ptr + seq * stride_table + b``. Example: block size
      4, ``block_tables[seq] = [7, 2, 0, 0]`` (rows are padded to max_blocks), ``seq_len = 6``. Position
      5 is logical block ``5 // 4 = 1``, physical block ``block_tables[seq, 1] = 2``, slot ``5 % 4 = 1``:
      its key for KV head ``j`` is at ``2 * stride_block + 1 * stride_slot + j * stride_head``. Positions
      0..3 are in block 7; the row's last two entries are padding, never read.
    * ``seq_len`` need not be a multiple of ``BLOCK_SIZE``: in the last block, slots at positions
      ``>= seq_len`` hold stale data from other requests. Mask them: their scores are ``-inf``.
    * GQA: query head ``head`` reads KV head ``head // GROUP``.
    * A context can be far longer than one block, and its scores must never be held all at once:
      read it a block at a time, with an online softmax (the chapter's section 5), in float32, and
      store the result in ``out``'s dtype. Scores can be large (the grader uses scores near 90,
      where ``exp`` of a raw score overflows float32).
    """
    # BEGIN SOLUTION
    # HINT: write the body of paged_decode_kernel
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    dims = tl.arange(0, HEAD_DIM)
    slots = tl.arange(0, BLOCK_SIZE)
    seq_len = tl.load(seq_lens_ptr + seq)
    q_offs = (seq * num_heads + head) * HEAD_DIM + dims
    q = tl.load(q_ptr + q_offs).to(tl.float32)

    m = float("-inf")  # the running max of the scores so far
    l = 0.0  # the running sum of exp(score - m)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)  # the running sum of exp(score - m) * v
    for b in range(tl.cdiv(seq_len, BLOCK_SIZE)):
        physical = tl.load(block_tables_ptr + seq * stride_table + b).to(tl.int64)
        in_context = b * BLOCK_SIZE + slots < seq_len
        offs = physical * stride_block + slots[:, None] * stride_slot + kv_head * stride_head + dims[None, :]
        k = tl.load(k_ptr + offs, mask=in_context[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=in_context[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[None, :] * k, axis=1) * scale
        scores = tl.where(in_context, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        alpha = tl.exp(m - m_new)  # rescales what was summed under the old max
        p = tl.exp(scores - m_new)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(out_ptr + q_offs, (acc / l).to(out_ptr.dtype.element_ty))
    # END SOLUTION


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale: float, out=None) -> torch.Tensor:
    """Given: your ``paged_decode_kernel`` through the course's launcher. q ``[num_seqs, num_heads,
    head_dim]`` (one query per sequence, at position ``seq_lens[i] - 1``), pools ``[num_blocks,
    block_size, num_kv_heads, head_dim]``, ``block_tables`` ``[num_seqs, max_blocks]`` and ``seq_lens``
    ``[num_seqs]``; returns ``[num_seqs, num_heads, head_dim]``, like ``paged_attention_reference``
    with ``query_start_loc = [0, 1, ..., num_seqs]``. ``out`` may be given, as in puzzle 1."""
    return launch_paged_decode(paged_decode_kernel, q, k_cache, v_cache, block_tables, seq_lens, scale, out)


# --- puzzle 3: a ragged batch, causal -----------------------------------------------------------
@triton.jit
def ragged_paged_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    block_tables_ptr,  # int32 [num_seqs, max_blocks]
    seq_lens_ptr,  # int32 [num_seqs]: each sequence's tokens in the cache, this step's included
    query_start_loc_ptr,  # int32 [num_seqs + 1]: where each sequence's queries start in q
    scale,
    num_heads,
    stride_table,
    stride_block,
    stride_slot,
    stride_head,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """A whole step's attention: every query of every sequence, prefills, chunks and decodes mixed.

    One program per (sequence, query, head): ``seq = tl.program_id(0)``, ``j = tl.program_id(1)``,
    ``head = tl.program_id(2)`` (grid ``(num_seqs, the longest q_len, num_heads)``).

    * Sequence ``seq``'s queries are the tokens ``query_start_loc[seq]`` to
      ``query_start_loc[seq + 1] - 1`` of ``q`` (contiguous ``[num_tokens, num_heads, head_dim]``, as
      ``out``): ``q_len`` of them, its newest tokens. A program with ``j >= q_len`` has no query.
    * Its ``seq_len = seq_lens[seq]`` tokens are in the cache (this step's keys and values already
      written), through its block table, laid out as in puzzle 2.
    * Causal: query ``j`` is the token at position ``seq_len - q_len + j``; it sees the keys at
      positions up to its own, and none after.
    * GQA, float32, large scores and the online softmax as in puzzle 2.

    Example: ``q_len = 3`` over ``seq_len = 10`` (a chunk of three tokens after seven cached ones):
    its queries are positions 7, 8 and 9, seeing 8, 9 and 10 keys.
    """
    # BEGIN SOLUTION
    # HINT: write the body of ragged_paged_kernel
    seq = tl.program_id(0)
    j = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if j < q_len:
        kv_head = head // GROUP
        dims = tl.arange(0, HEAD_DIM)
        slots = tl.arange(0, BLOCK_SIZE)
        seq_len = tl.load(seq_lens_ptr + seq)
        visible = seq_len - q_len + j + 1  # keys at positions 0 .. its own
        q_offs = ((q_start + j) * num_heads + head) * HEAD_DIM + dims
        query = tl.load(q_ptr + q_offs).to(tl.float32)
        running_max = float("-inf")
        running_sum = 0.0
        weighted = tl.zeros([HEAD_DIM], dtype=tl.float32)  # the running sum of exp(score - running_max) * v
        for b in range(tl.cdiv(visible, BLOCK_SIZE)):
            block = tl.load(block_tables_ptr + seq * stride_table + b).to(tl.int64)
            seen = b * BLOCK_SIZE + slots < visible
            offs = block * stride_block + slots[:, None] * stride_slot + kv_head * stride_head + dims[None, :]
            keys = tl.load(k_ptr + offs, mask=seen[:, None], other=0.0).to(tl.float32)
            values = tl.load(v_ptr + offs, mask=seen[:, None], other=0.0).to(tl.float32)
            scores = tl.where(seen, tl.sum(query[None, :] * keys, axis=1) * scale, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=0))
            rescale = tl.exp(running_max - new_max)
            weights = tl.exp(scores - new_max)
            running_sum = running_sum * rescale + tl.sum(weights, axis=0)
            weighted = weighted * rescale + tl.sum(weights[:, None] * values, axis=0)
            running_max = new_max
        tl.store(out_ptr + q_offs, (weighted / running_sum).to(out_ptr.dtype.element_ty))
    # END SOLUTION


def ragged_paged_attention(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale: float, out=None
) -> torch.Tensor:
    """Given: your ``ragged_paged_kernel`` through the course's launcher; the arguments and the
    result are ``paged_attention_reference``'s. ``out`` may be given, as in puzzle 1."""
    return launch_ragged(ragged_paged_kernel, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out)


# The paged engine's runners on your kernels: puzzle 2's in every decode-only step, or puzzle 3's in
# every step, e.g. LLM("tiny", engine="paged", dtype="float32", attention_backend="torch",
# runner_cls=YourRaggedKernelRunner). Their kernel_calls count the layer calls each way.
YourDecodeKernelRunner = decode_kernel_runner(paged_decode_kernel)
YourRaggedKernelRunner = ragged_kernel_runner(ragged_paged_kernel)
