"""Grading tests for chapter 4 (``pack``, ``unpack`` and ``ragged_attention``).

The learner's functions run in a child process (``minillm.course.sandbox``): the ``run_*`` probes
below call them there, and every check happens here, on the plain data they return. The oracle of
``ragged_attention`` is ``minillm.attention.causal.causal_attention``, the attention every engine runs,
applied to one sequence at a time, in float64: most tests run in float64, so a correct answer agrees
to rounding whatever order it adds things up in; one runs float32 and bfloat16 with their own tolerances.
"""

from itertools import accumulate

import pytest
import torch

from minillm.attention.causal import causal_attention
from minillm.course.sandbox import LearnerProcess, type_name

# The last rung of each test's hint ladder (check(..., hint=N)): the idea, never the code. A test
# gets the idea of the longest key in its name, else the "*" one.
IDEAS = {
    "pack": (
        "The idea: the sequences laid end to end, and the offsets where each one starts, with the total length last."
    ),
    "unpack": "The idea: the offsets cut the flat tensor back into the pieces that pack laid end to end.",
    "ragged_attention": (
        "The idea: one attention over the whole flat batch, with a mask that lets a query see only keys of "
        "its own sequence, at positions up to its own (a sequence's queries are its newest tokens)."
    ),
}


@pytest.fixture(scope="module")
def ch04():
    with LearnerProcess("ch04_selective") as learner:
        yield learner


# --- probes: these run in the learner's process ------------------------------------------------
def run_pack(ch04, seqs):
    return ch04.pack(seqs)


def run_unpack(ch04, flat, cu_seqlens):
    return ch04.unpack(flat, cu_seqlens)


def run_ragged_attention(ch04, q, k, v, cu_q, cu_k):
    return ch04.ragged_attention(q, k, v, cu_q, cu_k)


def run_pack_on_meta(ch04, lens):
    """``pack`` on the meta device (shapes, no data): where do its tensors live?"""
    got = ch04.pack([torch.zeros(n, 2, device="meta") for n in lens])
    return (
        [str(getattr(x, "device", type(x).__name__)) for x in got]
        if isinstance(got, (tuple, list))
        else type(got).__name__
    )


# --- checks: these run here --------------------------------------------------------------------
def check_pack(ch04, seqs):
    got = ch04.call(run_pack, seqs)
    assert isinstance(got, (tuple, list)) and len(got) == 2, f"return a pair (flat, cu_seqlens), got {type_name(got)}"
    flat, cu_seqlens = got
    lens = [len(s) for s in seqs]
    expected_cu = [0, *accumulate(lens)]
    assert isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dtype in (torch.int32, torch.int64), (
        f"cu_seqlens must be an integer tensor (int32, as varlen kernels take it), got {cu_seqlens!r}"
    )
    assert cu_seqlens.tolist() == expected_cu, (
        f"sequences of lengths {lens}: cu_seqlens should be {expected_cu}, got {cu_seqlens.tolist()}"
    )
    assert isinstance(flat, torch.Tensor), f"flat must be a torch.Tensor, got {type_name(flat)}"
    assert torch.equal(flat, torch.cat(seqs)), f"sequences of lengths {lens}: flat should be them one after another"
    return flat, cu_seqlens


def random_seqs(lens, *trailing, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, *trailing, generator=g, dtype=torch.float64) for n in lens]


@pytest.mark.hint(
    "flat = the sequences one after another; cu_seqlens = [0, n_0, n_0 + n_1, ...], one more entry than sequences."
)
def test_pack(ch04):
    check_pack(ch04, [torch.tensor([10, 11, 12, 13]), torch.tensor([27]), torch.tensor([35])])  # the docstring's tokens
    check_pack(ch04, random_seqs([3, 1, 5], 8))
    check_pack(ch04, random_seqs([7], 2, 4))
    check_pack(ch04, [torch.tensor([5])])  # one sequence of one token


@pytest.mark.hint(
    "Make cu_seqlens on flat's device (torch.tensor(..., device=flat.device)): on a GPU, the kernel reads it there."
)
def test_pack_keeps_the_device(ch04):
    got = ch04.call(run_pack_on_meta, [3, 1, 2])
    assert got == ["meta", "meta"], (
        f"pack of tensors on the meta device: (flat, cu_seqlens) devices should be ['meta', 'meta'], got {got}"
    )


@pytest.mark.hint("unpack returns a list with one tensor per sequence: flat[cu_seqlens[i]:cu_seqlens[i + 1]].")
def test_unpack(ch04):
    seqs = random_seqs([3, 1, 5, 2], 8)
    flat, cu_seqlens = torch.cat(seqs), torch.tensor([0, 3, 4, 9, 11], dtype=torch.int32)
    got = ch04.call(run_unpack, flat, cu_seqlens)
    assert isinstance(got, (list, tuple)) and len(got) == len(seqs), (
        f"expected a list of {len(seqs)} tensors, got {type_name(got)}"
    )
    for i, (g, s) in enumerate(zip(got, seqs)):
        assert isinstance(g, torch.Tensor), f"sequence {i} must be a torch.Tensor, got {type_name(g)}"
        assert torch.equal(g, s), (
            f"sequence {i} should be flat[{cu_seqlens[i]}:{cu_seqlens[i + 1]}], shape {tuple(s.shape)}"
        )
    # int64 offsets, and a sequence with no tokens (two equal offsets)
    got = ch04.call(run_unpack, flat[:6], torch.tensor([0, 3, 3, 6]))
    assert isinstance(got, (list, tuple)) and [tuple(g.shape) for g in got if isinstance(g, torch.Tensor)] == [
        (3, 8),
        (0, 8),
        (3, 8),
    ], f"unpack(flat, cu_seqlens=[0, 3, 3, 6]) should give sequences of 3, 0 and 3 rows, got {got!r}"


@pytest.mark.hint("unpack(*pack(seqs)) must give the sequences back.")
def test_pack_unpack_round_trip(ch04):
    seqs = random_seqs([4, 1, 1, 9, 2], 3, 5, seed=1)
    flat, cu_seqlens = check_pack(ch04, seqs)
    back = ch04.call(run_unpack, flat, cu_seqlens)
    assert isinstance(back, (list, tuple)) and len(back) == len(seqs), (
        f"expected a list of {len(seqs)} tensors, got {type_name(back)}"
    )
    assert all(isinstance(b, torch.Tensor) and torch.equal(b, s) for b, s in zip(back, seqs)), (
        "unpack(*pack(seqs)) differs from seqs"
    )


def make_batch(lens_q, lens_k, num_heads=4, num_kv_heads=2, head_dim=8, seed=0):
    """Random q, k, v for sequences with these query / key counts: flat tensors and cu_seqlens."""
    q = random_seqs(lens_q, num_heads, head_dim, seed=seed)
    k = random_seqs(lens_k, num_kv_heads, head_dim, seed=seed + 1)
    v = random_seqs(lens_k, num_kv_heads, head_dim, seed=seed + 2)
    cu = [torch.tensor([0, *accumulate(lens)], dtype=torch.int32) for lens in (lens_q, lens_k)]
    return q, k, v, cu


TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 6e-2}


def check_ragged(ch04, lens_q, lens_k, dtype=torch.float64, offsets_dtype=torch.int32, **shape):
    q, k, v, (cu_q, cu_k) = make_batch(lens_q, lens_k, **shape)
    q, k, v = ([x.to(dtype) for x in xs] for xs in (q, k, v))
    got = ch04.call(
        run_ragged_attention, torch.cat(q), torch.cat(k), torch.cat(v), cu_q.to(offsets_dtype), cu_k.to(offsets_dtype)
    )
    # The oracle runs in float64 on the same (rounded) inputs.
    expected = torch.cat([causal_attention(qi.double(), ki.double(), vi.double()) for qi, ki, vi in zip(q, k, v)])
    assert isinstance(got, torch.Tensor), f"return a torch.Tensor, got {type_name(got)}"
    assert got.shape == expected.shape, (
        f"the output should have q's shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    )
    assert got.dtype == dtype, f"the output should keep q's dtype {dtype}, got {got.dtype}"
    for i, (s, e) in enumerate(zip(cu_q.tolist(), cu_q.tolist()[1:])):
        err = (got[s:e].double() - expected[s:e]).abs().max().item() if e > s else 0.0
        assert err < TOLERANCE[dtype], (
            f"sequences with {lens_q} queries and {lens_k} keys, q {tuple(q[0].shape[1:])} k {tuple(k[0].shape[1:])}: "
            f"sequence {i} (queries {s}:{e}) differs from causal_attention by {err:.3g}"
        )


@pytest.mark.hint(
    "For one prefill (as many queries as keys), query j sees keys 0..j: a causal mask, softmax(q k^T / sqrt(D)) v."
)
def test_ragged_attention_one_prefill(ch04):
    check_ragged(ch04, [6], [6], num_heads=2, num_kv_heads=2)
    check_ragged(ch04, [1], [1], num_heads=2, num_kv_heads=2)


@pytest.mark.hint("Each query sees only keys of its own sequence: the mask is block-diagonal, one block per sequence.")
def test_ragged_attention_sequences_do_not_mix(ch04):
    check_ragged(ch04, [3, 5, 2], [3, 5, 2], num_heads=2, num_kv_heads=2)


@pytest.mark.hint(
    "The queries are the LAST n_q of a sequence's n_k keys: query j sits at position n_k - n_q + j and sees keys up "
    "to it."
)
def test_ragged_attention_decodes_and_chunks(ch04):
    check_ragged(ch04, [1], [9], num_heads=2, num_kv_heads=2)  # one decode: sees all 9 keys
    check_ragged(ch04, [3], [7], num_heads=2, num_kv_heads=2)  # a chunk of 3 after 4 cached tokens
    check_ragged(ch04, [4, 1, 1, 2], [4, 8, 3, 6], num_heads=2, num_kv_heads=2)  # a prefill beside decodes and a chunk


@pytest.mark.hint(
    "Grouped-query attention: query head h uses key/value head h // (H // KVH) (repeat_interleave k and v over heads)."
)
def test_ragged_attention_grouped_query_heads(ch04):
    check_ragged(ch04, [5, 1], [5, 6], num_heads=4, num_kv_heads=2)
    check_ragged(ch04, [2, 3], [4, 3], num_heads=6, num_kv_heads=2)
    check_ragged(ch04, [3], [3], num_heads=4, num_kv_heads=1)


@pytest.mark.hint(
    "Compare your ragged_attention with causal_attention on each sequence alone; mind the mask, the scale and GQA."
)
def test_ragged_attention_random_batches(ch04):
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        lens_q = torch.randint(1, 9, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()
        lens_k = [n + int(torch.randint(0, 12, (1,), generator=g)) for n in lens_q]
        check_ragged(ch04, lens_q, lens_k, offsets_dtype=torch.int64, num_heads=4, num_kv_heads=2, head_dim=16)


@pytest.mark.hint(
    "Work in q's dtype: the output must keep it (bfloat16 in, bfloat16 out), and any tensor you make "
    "for the mask or the scale must not turn it into float32 or float64."
)
def test_ragged_attention_float32_and_bfloat16(ch04):
    for dtype in (torch.float32, torch.bfloat16):
        check_ragged(ch04, [4, 1, 2], [4, 9, 5], dtype=dtype, num_heads=4, num_kv_heads=2, head_dim=16)
