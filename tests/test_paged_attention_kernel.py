"""minillm.kernels.paged_attention: the wrapper's checks, the reference against the contiguous model
attention, and the Triton kernel (under the interpreter, fp32) against the reference."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton: the kernel then runs on the CPU

import math
import random

import pytest
import torch

from minillm.attention.causal import causal_attention
from minillm.kernels import paged_attention, paged_attention_reference, paged_attention_torch

try:
    import triton  # noqa: F401

    from minillm.kernels.triton_paged_attention import triton_paged_attention
except ImportError as exc:  # pragma: no cover - triton is installed in the course env
    triton_paged_attention = None
    TRITON_MISSING = f"triton is not importable ({exc})"
else:
    TRITON_MISSING = ""


def make_batch(
    seq_lens,
    q_lens,
    *,
    block_size=16,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    dtype=torch.float32,
    seed=0,
    spare_blocks=3,
):
    """Random q and a shuffled pool; block-table entries past each sequence hold garbage ids."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(need) + spare_blocks
    max_blocks = max(need) + 1
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen, dtype=dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen, dtype=dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.full((len(seq_lens), max_blocks), 10**6, dtype=torch.int32)  # garbage: never read
    used = 0
    for i, n in enumerate(need):
        block_tables[i, :n] = perm[used : used + n]
        used += n
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen, dtype=dtype)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32)
    return dict(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=qsl,
        scale=1 / math.sqrt(head_dim),
    )


# --- the batched PyTorch implementation against the reference -------------------------------------------
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 4), (4, 2), (6, 2), (9, 3)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_the_batched_implementation_matches_the_reference(dtype, tol, num_heads, num_kv_heads, block_size):
    # decodes of different contexts (the shortest far below the longest), prompts and chunks among them,
    # block-table entries past each sequence's blocks holding garbage ids
    seq_lens, q_lens = [37, 5, 1, 20, 64, 9, 3], [1, 5, 1, 7, 1, 1, 2]
    batch = make_batch(
        seq_lens,
        q_lens,
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=16,
        dtype=dtype,
        seed=block_size,
    )
    torch.testing.assert_close(paged_attention_torch(**batch), paged_attention_reference(**batch), rtol=tol, atol=tol)
    torch.testing.assert_close(paged_attention(**batch, backend="torch"), paged_attention_torch(**batch))


# --- chapter 9's C decode kernel (backend="cpu"): the batched implementation with its decodes in C --------
@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 4), (4, 2), (6, 2), (9, 3)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("head_dim", [16, 64, 80])
def test_the_cpu_kernel_matches_the_reference(num_heads, num_kv_heads, block_size, head_dim):
    # decodes of contexts from 1 token to several blocks, with prompts and chunks among them
    seq_lens, q_lens = [37, 5, 1, 20, 64, 9, 3, 130], [1, 5, 1, 7, 1, 1, 2, 1]
    batch = make_batch(
        seq_lens, q_lens, block_size=block_size, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim
    )
    got = paged_attention(**batch, backend="cpu")
    torch.testing.assert_close(got, paged_attention_reference(**batch), rtol=1e-5, atol=1e-5)


def test_the_cpu_kernel_keeps_a_peaked_softmax_exact():
    """Scores hundreds apart: the kernel subtracts each row's maximum before exp, or it overflows."""
    batch = make_batch([40, 300], [1, 1], num_heads=4, num_kv_heads=2)
    batch["q"] *= 200
    got = paged_attention(**batch, backend="cpu")
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, paged_attention_reference(**batch), rtol=1e-5, atol=1e-5)


def test_the_cpu_prompt_kernel_matches_the_reference_on_its_tiles_edges():
    """The prompt kernel's tiles: whole prompts and chunks after earlier tokens, contexts and chunks
    that are not multiples of its 64-key and 16-query tiles (a tile crossing the diagonal, a last
    tile of one key), decodes in the same step (left to the decode kernel), and scores hundreds apart
    (the online softmax must rescale what it summed under a smaller maximum, or it overflows)."""
    for scale_q in (1, 60):
        batch = make_batch([300, 100, 64, 33, 129, 7], [200, 99, 32, 1, 65, 7], num_heads=9, num_kv_heads=3)
        batch["q"] *= scale_q
        got = paged_attention(**batch, backend="cpu")
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, paged_attention_reference(**batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim,block_size",
    [(4, 1, 64, 16), (16, 8, 128, 16), (6, 6, 80, 32), (4, 2, 24, 8), (2, 1, 8, 1)],
)
def test_the_cpu_prompt_kernel_takes_any_head_dim_group_and_block_size(num_heads, num_kv_heads, head_dim, block_size):
    """Four vecs of 16 floats of head_dim at a time, then the rest one by one (24, 8); groups of 1 to 4
    query heads a KV head; blocks of 1 to 32 tokens."""
    shape = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size)
    batch = make_batch([70, 21, 5], [70, 3, 5], **shape)
    got = paged_attention(**batch, backend="cpu")
    torch.testing.assert_close(got, paged_attention_reference(**batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q_lens", [[1, 1, 1], [1, 5, 1]], ids=["decodes", "mixed"])
def test_the_cpu_kernel_reads_a_strided_pool_and_int64_indices_correctly(q_lens):
    """A pool that is a view (every other block), and int64 tables: the kernels read raw memory, so
    they are handed contiguous int32 copies (the decodes' rows picked from the step's copy)."""
    batch = make_batch([37, 5, 64], q_lens, num_heads=6, num_kv_heads=2)
    expected = paged_attention_reference(**batch)
    for name in ("k_cache", "v_cache"):  # the same blocks, spread over a pool twice the size
        spread = torch.zeros(2 * batch[name].shape[0], *batch[name].shape[1:])
        spread[::2] = batch[name]
        batch[name] = spread[::2]
    batch["block_tables"], batch["seq_lens"] = batch["block_tables"].long(), batch["seq_lens"].long()
    assert not batch["k_cache"].is_contiguous()
    got = paged_attention(**batch, backend="cpu")
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_the_cpu_backend_refuses_what_its_kernel_cannot_take():
    with pytest.raises(ValueError, match=r"backend='cpu' runs on the CPU in torch.float32, got torch.float64 on cpu"):
        paged_attention(**make_batch([20, 9], [1, 3], dtype=torch.float64), backend="cpu")


def test_the_cpu_prompt_kernel_refuses_an_out_it_cannot_write_in_place():
    from minillm.kernels import cpu_attention

    batch = make_batch([20, 9], [20, 9])
    indices = [batch[k].to(torch.int32) for k in ("block_tables", "seq_lens", "query_start_loc")]
    out = torch.empty(29, 4, 128)[:, :, :64]  # the right shape, but each row's heads lie 128 apart
    with pytest.raises(ValueError, match="writes rows of out in place: it must be contiguous"):
        cpu_attention.paged_prefill_attention(
            out, batch["q"], batch["k_cache"], batch["v_cache"], *indices, torch.tensor([0, 1], dtype=torch.int32), 0.1
        )


def test_the_batched_implementation_with_only_decodes_or_only_prompts():
    for q_lens in ([1, 1, 1], [4, 2, 9]):
        batch = make_batch([30, 2, 9], q_lens, block_size=4)
        torch.testing.assert_close(paged_attention_torch(**batch), paged_attention_reference(**batch))


# --- the wrapper's checks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda b: b.update(q=b["q"][0]), "q must be [num_tokens"),
        (lambda b: b.update(k_cache=b["k_cache"][0]), "k_cache must be [num_blocks"),
        (lambda b: b.update(v_cache=b["v_cache"][:, :, :1]), "same shape"),
        (lambda b: b.update(q=b["q"].half()), "share a dtype"),
        (lambda b: b.update(q=b["q"].int()), "q must be a float tensor"),
        (lambda b: b.update(block_tables=b["block_tables"].float()), "block_tables must be int32 or int64"),
        (lambda b: b.update(seq_lens=b["seq_lens"].short()), "seq_lens must be int32 or int64"),
        (lambda b: b.update(seq_lens=b["seq_lens"][:1]), "seq_lens must be [num_seqs=2]"),
        (lambda b: b.update(query_start_loc=b["query_start_loc"][:2]), "query_start_loc must be [num_seqs + 1=3]"),
        (lambda b: b.update(query_start_loc=torch.tensor([0, 2, 1], dtype=torch.int32)), "must rise from 0"),
        (lambda b: b.update(seq_lens=torch.tensor([20, 2], dtype=torch.int32)), "must be >= its query count"),
        (lambda b: b.update(seq_lens=torch.tensor([20, 500], dtype=torch.int32)), "needs more than block_tables"),
        (lambda b: b.update(block_tables=b["block_tables"][0]), "block_tables must be [num_seqs, max_blocks]"),
    ],
)
def test_wrapper_rejects_bad_arguments_by_name(change, words):
    batch = make_batch([20, 9], [1, 3])
    change(batch)
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("+", r"\+")):
        paged_attention(**batch)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(block_size=12), "block_size .* power of two"),
        (dict(num_heads=6, num_kv_heads=4), "num_heads \\(6\\) must be a multiple of num_kv_heads \\(4\\)"),
    ],
)
def test_wrapper_rejects_unsupported_shapes(kwargs, words):
    with pytest.raises(ValueError, match=words):
        paged_attention(**make_batch([20, 9], [1, 3], **kwargs))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(block_size=4), "block_size .* must be >= 8 for backend='triton'"),
        (dict(head_dim=48), "head_dim must be one of .* for backend='triton'"),
    ],
)
def test_the_kernels_limits_apply_to_triton_only(kwargs, words):
    batch = make_batch([20, 9], [1, 3], **kwargs)
    with pytest.raises(ValueError, match=words):
        paged_attention(**batch, backend="triton")
    torch.testing.assert_close(paged_attention(**batch), paged_attention_reference(**batch))  # the reference takes them


def test_wrapper_rejects_unknown_backend():
    with pytest.raises(ValueError, match="backend must be one of"):
        paged_attention(**make_batch([5], [1]), backend="cuda")


# --- the reference is the model's attention, paged --------------------------------------------------


@pytest.mark.parametrize("block_size, num_heads, num_kv_heads", [(8, 4, 4), (16, 8, 2), (32, 6, 3)])
def test_reference_matches_causal_attention_per_sequence(block_size, num_heads, num_kv_heads):
    seq_lens, q_lens = [1, 7, 33, 40, 16, 50], [1, 7, 5, 1, 16, 0]  # decode, full prefill, chunk, empty
    batch = make_batch(
        seq_lens,
        q_lens,
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=32,
        dtype=torch.float64,
    )
    out = paged_attention(**batch)
    qsl = batch["query_start_loc"].tolist()
    for i, seq_len in enumerate(seq_lens):
        n = -(-seq_len // block_size)
        blocks = batch["block_tables"][i, :n].long()
        k = batch["k_cache"][blocks].flatten(0, 1)[:seq_len]
        v = batch["v_cache"][blocks].flatten(0, 1)[:seq_len]
        a, b = qsl[i], qsl[i + 1]
        if a < b:
            torch.testing.assert_close(out[a:b], causal_attention(batch["q"][a:b], k, v), rtol=1e-10, atol=1e-10)


def test_reference_keeps_low_precision_dtype():
    batch = make_batch([19], [3], dtype=torch.bfloat16)
    out = paged_attention_reference(**batch)
    assert out.dtype == torch.bfloat16 and out.shape == batch["q"].shape
    exact = paged_attention_reference(
        **{k: (v.double() if k in ("q", "k_cache", "v_cache") else v) for k, v in batch.items()}
    )
    torch.testing.assert_close(out.double(), exact, rtol=2e-2, atol=2e-2)


# --- the Triton kernel (interpreter, fp32) against the reference -------------------------------------

needs_triton = pytest.mark.skipif(triton_paged_attention is None, reason=TRITON_MISSING or "triton present")


def check_kernel(batch):
    """Poison the output so rows the kernel never writes show up as NaN, then compare."""
    out = torch.full_like(batch["q"], float("nan"))
    triton_paged_attention(**batch, out=out)
    torch.testing.assert_close(out, paged_attention_reference(**batch), rtol=1e-4, atol=1e-4)


@needs_triton
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_kernel_decode_step_matches_reference(block_size):
    seq_lens = [1, 5, block_size, block_size + 1, 3 * block_size - 1, 70]  # lengths off the block grid
    check_kernel(make_batch(seq_lens, [1] * len(seq_lens), block_size=block_size, num_heads=8, num_kv_heads=2))


@needs_triton
@pytest.mark.parametrize("block_size, num_heads, num_kv_heads", [(8, 4, 4), (16, 8, 2), (32, 6, 2)])
def test_kernel_mixed_step_matches_reference(block_size, num_heads, num_kv_heads):
    """Prefill chunks longer than one query tile, a decode, an empty sequence and a chunk mid-context."""
    seq_lens, q_lens = [40, 1, 33, 9, 70, 17], [40, 1, 0, 1, 21, 17]
    check_kernel(
        make_batch(
            seq_lens, q_lens, block_size=block_size, num_heads=num_heads, num_kv_heads=num_kv_heads, seed=block_size
        )
    )


@needs_triton
def test_kernel_on_random_batches():
    """A few random batches (G = 3 pads the head group; int64 tables; strided q from a fused qkv)."""
    rng = random.Random(0)
    for trial in range(3):
        block_size = rng.choice([8, 16, 32])
        seq_lens = [rng.randint(1, 90) for _ in range(rng.randint(1, 5))]
        q_lens = [rng.choice([1, rng.randint(0, s)]) for s in seq_lens]
        batch = make_batch(seq_lens, q_lens, block_size=block_size, num_heads=6, num_kv_heads=2, seed=trial)
        batch["block_tables"] = batch["block_tables"].long()
        qkv = torch.cat([batch["q"], torch.zeros_like(batch["q"])], dim=1)  # q as a non-contiguous view
        batch["q"] = qkv[:, :6]
        check_kernel(batch)


@needs_triton
def test_kernel_through_the_wrapper():
    batch = make_batch([23, 4], [3, 1])
    torch.testing.assert_close(
        paged_attention(**batch, backend="triton"), paged_attention(**batch), rtol=1e-4, atol=1e-4
    )


@needs_triton
def test_a_steps_triton_attention_checks_its_arguments_once_and_every_layer_matches(monkeypatch):
    """Three layers of one step through ``PagedKVCache``: the wrapper's checks run in the first layer
    only (the tables and lengths are the step's), and each layer's output is still the reference's."""
    import sys

    from minillm.attention.paged_kv import PagedKVCache

    wrapper = sys.modules["minillm.kernels.paged_attention"]  # the module (its package exports a function by that name)

    batch = make_batch([23, 4, 9], [3, 1, 9])
    checks = []
    real_check = wrapper._check
    monkeypatch.setattr(wrapper, "_check", lambda *args: (checks.append(1), real_check(*args))[1])
    layers = [make_batch([23, 4, 9], [3, 1, 9], seed=s) for s in range(3)]  # each layer's own pools
    num_slots = batch["k_cache"].shape[0] * batch["k_cache"].shape[1]
    cache = PagedKVCache(
        [b["k_cache"] for b in layers],
        [b["v_cache"] for b in layers],
        torch.tensor([num_slots - 1] * batch["q"].shape[0]),  # every new k, v to one slot (the reference reads it too)
        batch["block_tables"],
        batch["seq_lens"],
        batch["query_start_loc"],
        batch["scale"],
        backend="triton",
    )
    for i, b in enumerate(layers):
        k = v = torch.zeros(b["q"].shape[0], b["k_cache"].shape[2], b["k_cache"].shape[3])
        out = cache.attend(i, b["q"], k, v)
        expected = paged_attention_reference(**{**b, "block_tables": batch["block_tables"]})
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert len(checks) == 1
