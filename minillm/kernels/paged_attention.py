"""Attention over a paged KV cache: one entry point, ``paged_attention``, for decode and mixed steps.

Layout (vLLM's): ``k_cache``/``v_cache`` are pools ``[num_blocks, block_size, num_kv_heads, head_dim]``;
sequence ``i`` owns the physical blocks ``block_tables[i, :ceil(seq_lens[i] / block_size)]`` in logical
order. ``seq_lens[i]`` counts the whole context INCLUDING this step's tokens, whose K/V are already
in the pool. Sequence ``i``'s queries are ``q[query_start_loc[i]:query_start_loc[i + 1]]``; with
``q_len`` of them, query ``j`` sits at position ``seq_len - q_len + j`` and sees keys 0 .. that position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minillm.kernels import cpu_attention, cpu_build

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)
HEAD_DIMS = (16, 32, 64, 128, 256)  # the Triton kernel tiles head_dim whole, so a power of two >= 16
MIN_TRITON_BLOCK_SIZE = 8  # the sizes the kernel is tested with are 8, 16 and 32
BACKENDS = ("torch", "triton", "cpu")


def _check(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, backend) -> None:
    """Raise a ValueError that names the argument and the limit, before any kernel sees bad input."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_heads, head_dim], got shape {tuple(q.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be [num_blocks, block_size, num_kv_heads, head_dim], got shape {tuple(t.shape)}"
            )
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} must be a float tensor ({', '.join(map(str, FLOAT_DTYPES))}), got {t.dtype}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"q, k_cache and v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens), ("query_start_loc", query_start_loc)):
        if t.dtype not in INDEX_DTYPES:
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, kv_head_dim = k_cache.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"k_cache head_dim {kv_head_dim} must equal q's head_dim {head_dim}")
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size (k_cache.shape[1]) must be a power of two, got {block_size}")
    if backend == "triton":  # the reference takes any shape; these are the kernel's limits
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS} for backend='triton', got {head_dim}")
        if block_size < MIN_TRITON_BLOCK_SIZE:
            raise ValueError(
                f"block_size (k_cache.shape[1]) must be >= {MIN_TRITON_BLOCK_SIZE} for backend='triton', "
                f"got {block_size}; backend='torch' takes any power of two"
            )
    if backend == "cpu":  # the C kernel's limits
        cpu_build.check_usable(q.device, q.dtype, "backend")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables must be [num_seqs, max_blocks], got shape {tuple(block_tables.shape)}")
    num_seqs = block_tables.shape[0]
    if seq_lens.shape != (num_seqs,):
        raise ValueError(f"seq_lens must be [num_seqs={num_seqs}], got shape {tuple(seq_lens.shape)}")
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(
            f"query_start_loc must be [num_seqs + 1={num_seqs + 1}], got shape {tuple(query_start_loc.shape)}"
        )
    if q.device.type == "cpu" or backend == "torch":  # cheap on the CPU; on a GPU these would force a sync
        qsl, lens = query_start_loc.tolist(), seq_lens.tolist()
        if qsl[0] != 0 or qsl[-1] != num_tokens or any(b < a for a, b in zip(qsl, qsl[1:])):
            raise ValueError(f"query_start_loc must rise from 0 to num_tokens={num_tokens}, got {qsl}")
        for i, (a, b) in enumerate(zip(qsl, qsl[1:])):
            if b - a > lens[i]:
                raise ValueError(
                    f"seq_lens[{i}]={lens[i]} must be >= its query count {b - a} (it includes this step's tokens)"
                )
            if -(-lens[i] // block_size) > block_tables.shape[1]:
                raise ValueError(
                    f"seq_lens[{i}]={lens[i]} needs more than block_tables' {block_tables.shape[1]} blocks of "
                    f"{block_size}"
                )


def paged_attention(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, backend="torch"
) -> torch.Tensor:
    """Causal (GQA) attention of ``q`` over a paged KV cache; returns ``[num_tokens, num_heads, head_dim]``.

    ``backend="torch"`` runs ``paged_attention_torch`` (any device), ``"triton"`` the kernel, ``"cpu"``
    the PyTorch backend with its decodes in chapter 9's C kernel (float32 on the CPU); the readable
    reference, ``paged_attention_reference``, is what all three are tested against.
    """
    _check(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, backend)
    if backend == "triton":
        from minillm.kernels.triton_paged_attention import triton_paged_attention  # imports triton lazily

        return triton_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)
    plan = TorchAttentionPlan(block_tables, seq_lens, query_start_loc, k_cache.shape[1], backend == "cpu")
    return plan.attend(q, k_cache, v_cache, scale)


def gather_kv(cache: torch.Tensor, block_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's K (or V) made contiguous again: ``[seq_len, num_kv_heads, head_dim]``."""
    block_size = cache.shape[1]
    blocks = block_row[: -(-seq_len // block_size)].long()
    return cache[blocks].flatten(0, 1)[:seq_len]


def paged_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale) -> torch.Tensor:
    """The test oracle: per sequence, gather its blocks, then masked softmax attention in float32.

    A plain loop over sequences, because clarity matters more here than speed.
    """
    out = torch.empty_like(q)
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    groups = num_heads // num_kv_heads
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        a, b = starts[i], starts[i + 1]
        if a == b:
            continue
        k = gather_kv(k_cache, block_tables[i], seq_len).to(acc).repeat_interleave(groups, dim=1)  # [S, H, D]
        v = gather_kv(v_cache, block_tables[i], seq_len).to(acc).repeat_interleave(groups, dim=1)
        qi = q[a:b].to(acc)  # [T, H, D]
        scores = torch.einsum("thd,shd->hts", qi, k) * scale  # [H, T, S]
        q_pos = torch.arange(seq_len - (b - a), seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
        out[a:b] = torch.einsum("hts,shd->thd", scores.softmax(dim=-1), v).to(q.dtype)
    return out


def paged_attention_torch(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale) -> torch.Tensor:
    """The same attention as the reference, without a Python loop over the step's decodes: the CPU
    engine's backend. All the decoding sequences (one query each) attend in one batched call; the few
    sequences with several queries (a prompt, or a chunk of one) each attend in a call of their own.
    Both calls are PyTorch's ``scaled_dot_product_attention``, which never holds the whole score
    matrix, and each reads a KV head once for the query heads that share it (for a prompt through
    ``enable_gqa``; for the decodes by grouping the sharing heads as that KV head's queries).

    The step's layout (which rows decode, their block tables, the masks) is the same in every layer,
    so it is worked out once, by ``TorchAttentionPlan``; the engine keeps the plan for the whole step
    and calls ``plan.attend`` in each layer."""
    return TorchAttentionPlan(block_tables, seq_lens, query_start_loc, k_cache.shape[1]).attend(
        q, k_cache, v_cache, scale
    )


class TorchAttentionPlan:
    """One step's layout for ``paged_attention_torch``, read once from the int tensors (on the host:
    free on a CPU; on a GPU the Triton kernel runs instead).

    The decodes' keys and values are gathered through their block tables into one padded
    ``[num_decodes, num_kv_heads, longest context, head_dim]`` view; padded positions are masked out.
    Each multi-query sequence keeps its own slice of queries, its blocks and its causal mask (none
    when its queries are its whole context: then the kernel's own causal order skips the masked half).

    With ``cpu_fast`` (chapter 9's ``"cpu"`` backend) the step attends through the C kernels of
    ``minillm.kernels.cpu_attention`` instead, which read the blocks in place: the decodes in one
    call, the prompts and chunks in another whose small tiles skip the masked half of their scores."""

    def __init__(self, block_tables, seq_lens, query_start_loc, block_size: int, cpu_fast: bool = False):
        device = block_tables.device
        starts, lens = query_start_loc.tolist(), seq_lens.tolist()
        decodes = [i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1]
        self.decode_rows, self.cpu_fast = None, cpu_fast
        if decodes:
            self.decode_rows = torch.tensor([starts[i] for i in decodes], device=device)  # each decode's query row
        if cpu_fast:  # once per step, in the kernels' int32, rather than converted in each layer's call
            block_tables, seq_lens = block_tables.to(torch.int32), seq_lens.to(torch.int32)
        if decodes and cpu_fast:
            self.decode_tables, self.decode_lens = block_tables[decodes], seq_lens[decodes]  # gathered: contiguous
        elif decodes:
            self.context = max(lens[i] for i in decodes)
            width = -(-self.context // block_size)
            tables = block_tables[decodes, :width].long()  # [B, width]
            decode_lens = seq_lens[decodes, None]
            held = (decode_lens + block_size - 1) // block_size  # [B, 1]: the blocks each one holds
            # past them: block 0, read but masked out; flat, for index_select (a block copy, several
            # times faster than indexing the pool with a [B, width] tensor)
            self.decode_blocks = tables.masked_fill(torch.arange(width, device=device) >= held, 0).flatten()
            self.decode_shape = (len(decodes), width * block_size)  # [B, padded context]
            key_ok = torch.arange(self.context, device=device) < decode_lens  # [B, context]
            self.decode_mask = key_ok[:, None, None, :]
        multi = [i for i in range(len(lens)) if starts[i + 1] - starts[i] > 1]
        self.prefills = []  # (first row, end row, its blocks, context, [1, 1, T, S] causal mask or None)
        self.prefill_ids = None  # cpu_fast: the multi-query sequences, and the step's tables in int32
        if multi and cpu_fast:
            self.prefill_ids = torch.tensor(multi, dtype=torch.int32)
            self.step_indices = [t.to(torch.int32).contiguous() for t in (block_tables, seq_lens, query_start_loc)]
        for i in multi if not cpu_fast else ():
            a, b, n = starts[i], starts[i + 1], lens[i]
            blocks = block_tables[i, : -(-n // block_size)].long()
            visible = None  # a whole prompt: SDPA's is_causal
            if b - a < n:  # a chunk after earlier tokens: its queries end the context
                q_pos = torch.arange(n - (b - a), n, device=device)  # [T]
                visible = (torch.arange(n, device=device)[None, :] <= q_pos[:, None])[None, None]  # [1, 1, T, S]
            self.prefills.append((a, b, blocks, n, visible))

    def attend(self, q, k_cache, v_cache, scale) -> torch.Tensor:
        """One layer's attention for the planned step: ``q`` ``[num_tokens, H, D]`` over the pools."""
        out = q.new_empty(q.shape)  # contiguous, whatever q's strides
        if self.decode_rows is not None and self.cpu_fast:
            o = cpu_attention.paged_decode_attention(
                q.index_select(0, self.decode_rows), k_cache, v_cache, self.decode_tables, self.decode_lens, scale
            )
            out.index_copy_(0, self.decode_rows, o)
        elif self.decode_rows is not None:
            rows, context = self.decode_rows, self.context

            def gather(cache):  # -> [B, KVH, context, D]
                blocks = cache.index_select(0, self.decode_blocks)
                return blocks.view(*self.decode_shape, *cache.shape[2:])[:, :context].transpose(1, 2)

            k, v = gather(k_cache), gather(v_cache)
            # The query heads that share a KV head stand in for that head's queries (one token, so
            # no causal order among them): attention over KVH heads, each KV head read once.
            num_decodes, num_heads, head_dim = len(rows), q.shape[1], q.shape[2]
            grouped = q.index_select(0, rows).view(num_decodes, k.shape[1], num_heads // k.shape[1], head_dim)
            o = F.scaled_dot_product_attention(grouped, k, v, attn_mask=self.decode_mask, scale=scale)  # as grouped
            out.index_copy_(0, rows, o.reshape(num_decodes, num_heads, head_dim))
        if self.prefill_ids is not None:
            cpu_attention.paged_prefill_attention(out, q, k_cache, v_cache, *self.step_indices, self.prefill_ids, scale)
        for a, b, blocks, n, visible in self.prefills:
            k = k_cache.index_select(0, blocks).flatten(0, 1)[:n].transpose(0, 1)  # [KVH, S, D]
            v = v_cache.index_select(0, blocks).flatten(0, 1)[:n].transpose(0, 1)
            o = F.scaled_dot_product_attention(  # q [1, H, T, D] -> [1, H, T, D]: 4-D, PyTorch's fused CPU kernel
                q[None, a:b].transpose(1, 2),
                k[None],
                v[None],
                attn_mask=visible,
                is_causal=visible is None,
                scale=scale,
                enable_gqa=True,
            )
            out[a:b] = o[0].transpose(0, 1)
        return out
