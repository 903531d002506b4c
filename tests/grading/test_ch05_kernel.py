"""Grading tests for chapter 5's kernel puzzles (``one_block_attention_kernel`` and ``paged_decode_kernel``).

The learner's kernels run in a child process (``minillm.course.sandbox``), which sets
``TRITON_INTERPRET=1``: Triton's interpreter runs them on CPU tensors, in float32, on any machine.
Each interpreted launch costs a fraction of a second, so every check below is ONE launch on a batch
built to catch one mistake. The oracle is ``paged_attention_reference``, computed here: puzzle 1 is
a one-block block table, puzzle 2 a batch of decodes (one query per sequence, at position
``seq_len - 1``). Outputs are poisoned with NaN, so a row the kernel never writes shows. Last, the
decode kernel runs inside the paged engine, whose tokens must not change.
"""

import math

import pytest
import torch

from minillm import LLM, workloads
from minillm.course.kernel_puzzles import (
    decode_kernel_runner,
    launch_one_block,
    launch_paged_decode,
    launch_ragged,
    ragged_kernel_runner,
)
from minillm.course.sandbox import LearnerProcess, type_name
from minillm.engines import build_engine
from minillm.kernels.paged_attention import paged_attention_reference
from minillm.request import Request
from minillm.sim.clock import TickClock

ATOL = RTOL = 1e-4  # float32, summed in another order than the reference's


# The last rung of each test's hint ladder (check(..., hint=N)): the idea, never the code. A test
# gets the idea of the longest key in its name, else the "*" one.
IDEAS = {
    "one_block": (
        "The idea: load this head's query and the block's keys and values (of the KV head its group shares), "
        "take the scaled dot products, and return the softmax-weighted sum of the values."
    ),
    "ragged": (
        "The idea: puzzle 2 for every query of the step: find the query's row from query_start_loc and its "
        "position from its sequence's length and query count, then walk only the keys up to that position."
    ),
    "decode": (
        "The idea: walk the sequence's blocks through its table, keeping a running max, a running sum of "
        "exponentials and a running weighted sum of values; rescale what you have whenever the max grows, and "
        "give slots past the sequence's length no weight."
    ),
}


@pytest.fixture(scope="module")
def ch05k():
    with LearnerProcess("ch05_kernel") as learner:
        yield learner


# --- probes: these run in the learner's process ------------------------------------------------
# The grader launches the learner's kernels itself, with the course's launchers: only a kernel's body
# is graded, whatever the learner's own launchers do.
def run_one_block(ch05k, q, k_cache, v_cache, block_id, scale):
    out = torch.full_like(q, math.nan)
    return launch_one_block(ch05k.one_block_attention_kernel, q, k_cache, v_cache, block_id, scale, out)


def run_paged_decode(ch05k, q, k_cache, v_cache, block_tables, seq_lens, scale):
    out = torch.full_like(q, math.nan)
    return launch_paged_decode(ch05k.paged_decode_kernel, q, k_cache, v_cache, block_tables, seq_lens, scale, out)


def run_engine_with_your_kernel(ch05k, workload, **options):
    return run_engine(workload, decode_kernel_runner(ch05k.paged_decode_kernel), **options)


def run_ragged(ch05k, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale):
    out = torch.full_like(q, math.nan)
    return launch_ragged(
        ch05k.ragged_paged_kernel, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out
    )


def run_engine_with_your_ragged_kernel(ch05k, workload, **options):
    return run_engine(workload, ragged_kernel_runner(ch05k.ragged_paged_kernel), **options)


# --- the engine ------------------------------------------------------------------------------------
def run_engine(workload, runner_cls=None, **options) -> dict:
    """``workload`` through the paged engine (tiny model, float32): each request's tokens, and how many
    layer calls ran your decode kernel (``None`` for the engine's own runner)."""
    model = LLM("tiny", dtype="float32", device="cpu").model
    engine = build_engine(
        "paged", model, torch.device("cpu"), None, runner_cls=runner_cls, attention_backend="torch", **options
    )
    engine.clock = TickClock()
    requests = [
        Request(str(i), p, sp, t, seed=i)
        for i, (p, sp, t) in enumerate(zip(workload.prompts, workload.sampling_params, workload.arrival_times))
    ]
    for r in requests:
        engine.add_request(r)
    engine.run_to_completion()
    calls = getattr(engine.runner, "kernel_calls", None)
    return {
        "tokens": [list(r.output_token_ids) for r in requests],
        "kernel_calls": dict(calls) if calls is not None else None,
    }


# --- checks: these run here --------------------------------------------------------------------
def pools(num_blocks, block_size, num_kv_heads, head_dim, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def compare(got, expected, where: str, what: str) -> None:
    """``got`` against the oracle ``expected`` ``[..., num_heads, head_dim]``: type, shape, rows written, values."""
    assert isinstance(got, torch.Tensor), f"{where}: the output should be a tensor, got {type_name(got)}"
    assert got.shape == expected.shape, f"{where}: the output should be {tuple(expected.shape)}, got {tuple(got.shape)}"
    rows = expected.shape[:-1]
    unwritten = [tuple(i) for i in torch.isnan(got).any(-1).nonzero().tolist()]
    assert not unwritten, (
        f"{where}: your kernel never wrote {what} {unwritten[:4]}{' ...' if len(unwritten) > 4 else ''} "
        f"(or wrote NaN there) of {tuple(rows)}"
    )
    err = (got - expected).abs()
    bad = err > ATOL + RTOL * expected.abs()
    if bad.any():
        worst = tuple(bad.any(-1).nonzero()[0].tolist())
        raise AssertionError(
            f"{where}: {what} {worst} differs from paged_attention_reference by up to "
            f"{err[worst].max().item():.3g} ({int(bad.any(-1).sum())} of {bad.any(-1).numel()} wrong)"
        )


def check_one_block(ch05k, num_heads, num_kv_heads, head_dim, block_size, block_id, num_blocks=4, scale=None, seed=0):
    scale = head_dim**-0.5 if scale is None else scale
    k_cache, v_cache = pools(num_blocks, block_size, num_kv_heads, head_dim, seed)
    q = torch.randn(num_heads, head_dim, generator=torch.Generator().manual_seed(seed + 1))
    got = ch05k.call(run_one_block, q, k_cache, v_cache, block_id, scale)
    one = torch.tensor([1], dtype=torch.int32)
    expected = paged_attention_reference(
        q[None],
        k_cache,
        v_cache,
        torch.tensor([[block_id]], dtype=torch.int32),
        one * block_size,
        torch.tensor([0, 1], dtype=torch.int32),
        scale,
    )[0]
    where = (
        f"one_block_attention_kernel with {num_heads} heads, {num_kv_heads} KV heads, head_dim {head_dim}, "
        f"block_size {block_size}, block_id {block_id} of {num_blocks}, scale {scale:.4g}"
    )
    compare(got, expected, where, "head")


def check_decode(
    ch05k,
    seq_lens,
    block_tables,
    num_heads=4,
    num_kv_heads=4,
    head_dim=32,
    block_size=16,
    num_blocks=None,
    scale=None,
    seed=0,
    q=None,
    pools_kv=None,
):
    """A batch of decodes: sequence i has ``seq_lens[i]`` tokens in blocks ``block_tables[i]``."""
    scale = head_dim**-0.5 if scale is None else scale
    width = max(map(len, block_tables))
    table = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32)
    num_blocks = num_blocks or int(table.max()) + 2
    k_cache, v_cache = pools_kv if pools_kv is not None else pools(num_blocks, block_size, num_kv_heads, head_dim, seed)
    if q is None:
        q = torch.randn(len(seq_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(seed + 1))
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    got = ch05k.call(run_paged_decode, q, k_cache, v_cache, table, lens, scale)
    expected = paged_attention_reference(
        q, k_cache, v_cache, table, lens, torch.arange(len(seq_lens) + 1, dtype=torch.int32), scale
    )
    where = (
        f"paged_decode_kernel with seq_lens {list(seq_lens)}, block_tables {block_tables}, block_size {block_size}, "
        f"{num_heads} heads, {num_kv_heads} KV heads, head_dim {head_dim}"
    )
    compare(got, expected, where, "(sequence, head)")


# --- puzzle 1: one query, one block ----------------------------------------------------------------
@pytest.mark.hint(
    "out[h] = softmax(scale * q[h] . k) v over the block's BLOCK_SIZE keys: q[h] starts at h * HEAD_DIM, "
    "key (slot s, dim d) at block_id * stride_block + s * stride_slot + kv_head * stride_head + d."
)
def test_one_block_attention(ch05k):
    check_one_block(ch05k, num_heads=4, num_kv_heads=4, head_dim=16, block_size=16, block_id=0, num_blocks=1)
    check_one_block(ch05k, num_heads=2, num_kv_heads=2, head_dim=64, block_size=8, block_id=0, num_blocks=1, seed=1)


@pytest.mark.hint(
    "GQA: query head h reads KV head h // GROUP (GROUP = num_heads // num_kv_heads query heads share one), "
    "not h % num_kv_heads nor h // num_kv_heads."
)
def test_one_block_grouped_query_heads(ch05k):
    check_one_block(ch05k, num_heads=8, num_kv_heads=2, head_dim=16, block_size=16, block_id=0, num_blocks=3)


@pytest.mark.hint("Read physical block block_id: its keys start at block_id * stride_block, not at the pool's start.")
def test_one_block_reads_block_id(ch05k):
    check_one_block(ch05k, num_heads=4, num_kv_heads=4, head_dim=16, block_size=16, block_id=3, num_blocks=5)


@pytest.mark.hint("Multiply the scores by the `scale` argument before the softmax (it need not be 1/sqrt(head_dim)).")
def test_one_block_applies_scale(ch05k):
    check_one_block(ch05k, num_heads=4, num_kv_heads=4, head_dim=16, block_size=16, block_id=1, scale=0.9, seed=2)


# --- puzzle 2: a batch of decodes ------------------------------------------------------------------
@pytest.mark.hint(
    "Each (sequence, head) program attends over the sequence's keys: scores = scale * q . k, then the "
    "online softmax over the blocks; out = acc / l at the end."
)
def test_decode_one_block(ch05k):
    check_decode(ch05k, [16], [[2]])


@pytest.mark.hint(
    "seq_len need not be a multiple of BLOCK_SIZE: slots at positions >= seq_len in the last block hold stale "
    "data. Mask them in the SCORES (-inf): a masked load alone gives them score 0, which softmax still counts."
)
def test_decode_context_not_a_multiple_of_block_size(ch05k):
    check_decode(ch05k, [5, 21, 1, 16], [[4], [0, 3], [1], [2]])


@pytest.mark.hint(
    "Logical block b of a sequence is PHYSICAL block block_tables[seq, b] (load it from the table): "
    "a sequence's blocks lie anywhere in the pool, in any order."
)
def test_decode_follows_the_block_table(ch05k):
    check_decode(ch05k, [64], [[3, 0, 5, 1]], num_blocks=7)


@pytest.mark.hint(
    "Each program reads its OWN sequence: q[seq, head], seq_lens[seq], and row seq of the block table "
    "(block_tables_ptr + seq * stride_table + b)."
)
def test_decode_batch_of_sequences(ch05k):
    check_decode(ch05k, [40, 9, 33], [[6, 2, 4], [1, 0, 0], [5, 3, 0]], num_blocks=8)


@pytest.mark.hint(
    "GQA: query head h reads KV head h // GROUP (GROUP = num_heads // num_kv_heads), not h % num_kv_heads."
)
def test_decode_grouped_query_heads(ch05k):
    check_decode(ch05k, [20, 7], [[1, 3], [0]], num_heads=8, num_kv_heads=2, num_blocks=5)


def ramp_scores(seq_lens, block_size, num_blocks, tables, head_dim, scale, low, high, seed):
    """q and pools whose scores (scale * q . k) run from ``low`` to ``high`` along each sequence
    (rising in sequence 0, falling in sequence 1), plus noise."""
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache = pools(num_blocks, block_size, 1, head_dim, seed)
    a = 4.0
    q = torch.zeros(len(seq_lens), 1, head_dim)
    q[:, 0, 0] = a  # q . k = a * k[0]: every score is set by k's first coordinate
    for i, (n, table) in enumerate(zip(seq_lens, tables)):
        scores = torch.linspace(low, high, n) + torch.rand(n, generator=g)
        if i % 2:
            scores = scores.flip(0)
        for p, s in enumerate(scores.tolist()):
            k_cache[table[p // block_size], p % block_size, 0, 0] = s / (scale * a)
    return q, (k_cache, v_cache)


@pytest.mark.hint(
    "Online softmax: subtract the running max before exp (exp(90) overflows float32), and when a block raises "
    "the max from m to m_new, multiply BOTH l and acc by exp(m - m_new)."
)
def test_decode_large_scores(ch05k):
    tables, lens = [[2, 0, 4, 1], [3, 5]], [60, 29]
    scale = 32**-0.5
    q, kv = ramp_scores(lens, 16, 6, tables, 32, scale, low=40.0, high=120.0, seed=5)
    check_decode(ch05k, lens, tables, num_heads=1, num_kv_heads=1, num_blocks=6, scale=scale, q=q, pools_kv=kv)


@pytest.mark.points(2)
@pytest.mark.hint(
    "Inside the paged engine, every decode-only step runs your paged_decode_attention in each layer "
    "(the pools' real block tables, GQA, block_size 4): a wrong output changes the generated tokens."
)
def test_decode_kernel_runs_the_paged_engine(ch05k):
    w = workloads.fixed(prompt_lens=[5, 9, 3], output_lens=[5, 3, 4], seed=2)
    options = dict(max_num_seqs=3, block_size=4, num_gpu_blocks=12)
    got = ch05k.call(run_engine_with_your_kernel, w, **options)
    expected = run_engine(w, **options)
    calls = got["kernel_calls"]
    assert calls and calls.get("yours", 0) > 0, f"the engine never ran your decode kernel (layer calls: {calls})"
    for i, (g, e) in enumerate(zip(got["tokens"], expected["tokens"])):
        assert g == e, f"{options}: request {i} generated {g} with your decode kernel, expected {e}"


# --- puzzle 3: a ragged batch, causal -------------------------------------------------------------
def check_ragged(ch05k, q_lens, seq_lens, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, seed=0):
    """Sequence i has ``q_lens[i]`` queries, its newest tokens, over ``seq_lens[i]`` tokens in blocks
    dealt out of a shuffled pool."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks, generator=g).tolist()
    table = torch.zeros(len(seq_lens), max(need), dtype=torch.int32)
    for i, n in enumerate(need):
        table[i, :n] = torch.tensor([perm.pop() for _ in range(n)])
    k_cache, v_cache = pools(num_blocks, block_size, num_kv_heads, head_dim, seed)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=g)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    got = ch05k.call(run_ragged, q, k_cache, v_cache, table, lens, qsl, head_dim**-0.5)
    expected = paged_attention_reference(q, k_cache, v_cache, table, lens, qsl, head_dim**-0.5)
    where = (
        f"ragged_paged_kernel with q_lens {list(q_lens)} over seq_lens {list(seq_lens)} (query_start_loc "
        f"{qsl.tolist()}), block_size {block_size}, {num_heads} heads, {num_kv_heads} KV heads"
    )
    compare(got, expected, where, "(query token, head)")


@pytest.mark.hint("Causal: query j of a prompt sees the keys at positions up to its own, not the whole sequence.")
def test_ragged_one_prefill(ch05k):
    check_ragged(ch05k, [6], [6])


@pytest.mark.hint(
    "A chunk's queries are its sequence's NEWEST tokens: query j sits at position seq_len - q_len + j, after the "
    "cached ones, not at position j."
)
def test_ragged_chunk_after_cached_tokens(ch05k):
    check_ragged(ch05k, [3], [10], seed=1)


@pytest.mark.hint(
    "Each sequence's queries start at row query_start_loc[seq] of q: read and write its query j at row "
    "query_start_loc[seq] + j."
)
def test_ragged_mixed_batch(ch05k):
    check_ragged(ch05k, [5, 3, 1, 1], [5, 11, 6, 13], seed=2)


@pytest.mark.points(2)
@pytest.mark.hint(
    "Inside the paged engine every step, prefills and decodes alike, runs your ragged kernel in every layer: "
    "a wrong row changes the generated tokens."
)
def test_ragged_kernel_runs_the_paged_engine(ch05k):
    w = workloads.fixed(prompt_lens=[5, 9, 3], output_lens=[3, 2, 3], seed=3)
    options = dict(max_num_seqs=3, block_size=4, num_gpu_blocks=12)
    got = ch05k.call(run_engine_with_your_ragged_kernel, w, **options)
    expected = run_engine(w, **options)
    calls = got["kernel_calls"]
    assert calls and calls.get("yours", 0) > 0, f"the engine never ran your ragged kernel (layer calls: {calls})"
    for i, (g, e) in enumerate(zip(got["tokens"], expected["tokens"])):
        assert g == e, f"{options}: request {i} generated {g} with your ragged kernel, expected {e}"
