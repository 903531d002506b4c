"""Grading tests for chapter 7 (``MyPrefixCachingBlockManager`` and ``hash_block``).

The learner's code runs in a child process (``minillm.course.sandbox``): the ``run_*`` probes below
drive it there and return plain data. The oracles are minillm's own: ``PrefixCachingBlockManager``
runs the same operations here, and the contract fixes everything they are compared on (which block
is handed out, which blocks a lookup finds, which are named, held and free), since the order of the
free queue is part of it. In the engine, the learner's allocator must generate the tokens of the
engine without the cache, find as many cached tokens as minillm's allocator, and leave every block
free at the end.
"""

import random
from functools import cache

import pytest
import torch

from minillm import LLM
from minillm.course.sandbox import LearnerProcess
from minillm.engines import build_engine
from minillm.engines.paged import PagedScheduler
from minillm.kv.prefix_cache import PrefixCachingBlockManager
from minillm.request import Request
from minillm.sampling_params import SamplingParams
from minillm.sim.clock import TickClock
from minillm.workloads import Workload

# The last rung of each test's hint ladder (check(..., hint=N)): the idea, never the code. A test
# gets the idea of the longest key in its name, else the "*" one.
IDEAS = {
    "*": (
        "The idea: a full, computed block is named by its tokens and the name of the block before it; a prompt "
        "shares every named block it finds, in order, until the first miss; reference counts say how many tables "
        "hold a block; a block nobody holds waits on the free queue with its name, and loses it only when it is "
        "handed out again, least recently freed first."
    ),
    "engine": (
        "The idea: the cache may only skip work, never change it: a request starts with blocks that hold exactly "
        "its first tokens' keys and values, every held block stays its holders' until the last one lets go, and "
        "every block comes back to the free queue."
    ),
}

BS = 4  # block_size of the hand-made cases


@pytest.fixture(scope="module")
def ch07():
    with LearnerProcess("ch07_prefix_caching") as learner:
        yield learner


# --- the hand-made cases: operations on an allocator, run in both processes ---------------------------
def apply_ops(bm, prompts: dict, ops) -> list[dict]:
    """Run ``ops`` on an allocator; after each, its result (or error) and the allocator's state.

    ``prompts`` maps a request id to its prompt. An operation is:

    * ``("compute", rid, n)``: ``rid`` computes its next ``n`` prompt tokens (``allocate_slots``, then
      ``cache_full_blocks``, as the engine does after a step); the result is ``allocate_slots``';
    * ``("admit", rid)``: the scheduler's admission of a new request: look its prompt up (all but its
      last token), share what is found, allocate and compute the rest; the result is
      ``[tokens found, admitted]`` (a request that does not fit gives its shared blocks back);
    * ``("share", rid, other, k)``: ``rid``'s table starts with ``other``'s first ``k`` blocks;
    * ``("find", tokens)``: the result is ``find_cached_blocks(tokens)``;
    * ``("free", rid)``, ``("reset",)``: the result is what ``free`` / ``reset_prefix_cache`` return.
    """
    requests = {rid: Request(rid, p, SamplingParams(max_tokens=1), 0.0) for rid, p in prompts.items()}
    results = []
    for op in ops:
        request = requests.get(op[1]) if len(op) > 1 and isinstance(op[1], str) else None
        try:
            if op[0] == "compute":
                result = bm.allocate_slots(request, op[2])
                if result:
                    request.num_computed_tokens += op[2]
                    bm.cache_full_blocks(request)
            elif op[0] == "admit":
                found = bm.find_cached_blocks(request.prompt_token_ids[:-1])
                if found:
                    bm.share_cached_blocks(request.request_id, list(found))
                request.num_computed_tokens = len(found) * BS
                result = [request.num_computed_tokens, bm.allocate_slots(request, request.num_tokens - len(found) * BS)]
                if result[1]:
                    request.num_computed_tokens = request.num_tokens
                    bm.cache_full_blocks(request)
                elif found:
                    bm.free(request)
                    request.num_computed_tokens = 0
            elif op[0] == "share":
                bm.share_cached_blocks(request.request_id, list(bm.get_block_table(op[2])[: op[3]]))
                request.num_computed_tokens = op[3] * BS
                result = None
            elif op[0] == "find":
                result = list(bm.find_cached_blocks(list(op[1])))
            elif op[0] == "free":
                result = list(bm.free(request))
                request.num_computed_tokens = 0
            else:
                result = bm.reset_prefix_cache()
            error = None
        except NotImplementedError:
            raise
        except Exception as err:
            result, error = None, f"{type(err).__name__}: {err}"
        tables = {rid: list(bm.get_block_table(rid)) for rid in requests}
        held = sorted({b for t in tables.values() for b in t})
        results.append(
            {
                "result": result,
                "error": error,
                "num_free": bm.num_free_blocks,
                "tables": {rid: t for rid, t in tables.items() if t},
                "ref_counts": {b: bm.ref_counts[b] for b in held},
                "named": sorted(set(bm.cached_block_ids.values())),
            }
        )
    return results


# --- probes: these run in the learner's process ------------------------------------------------------
def run_my_block_manager(ch07, num_blocks, prompts, ops):
    return apply_ops(ch07.MyPrefixCachingBlockManager(num_blocks, BS), prompts, ops)


def run_hash_block(ch07):
    h = ch07.hash_block
    first = h(None, [1, 2, 3, 4])
    return {
        "same tokens, list or tuple": first == h(None, (1, 2, 3, 4)),
        "called again": first == h(None, [1, 2, 3, 4]),
        "other tokens": first != h(None, [1, 2, 3, 5]),
        "same tokens after another parent": h(first, [5, 6, 7, 8]) != h(h(None, [9, 9, 9, 9]), [5, 6, 7, 8]),
        "same tokens, first block or not": h(None, [5, 6, 7, 8]) != h(first, [5, 6, 7, 8]),
        "the chain, recomputed": h(first, [5, 6, 7, 8]) == h(h(None, (1, 2, 3, 4)), (5, 6, 7, 8)),
    }


# --- checks: these run here --------------------------------------------------------------------------
FIELDS = {
    "result": "the result",
    "num_free": "num_free_blocks",
    "tables": "the block tables",
    "ref_counts": "the reference counts of the held blocks",
    "named": "the named blocks (cached_block_ids' values)",
}


def blocks_of(tokens) -> str:
    """``[1 2 3 4 | 5 6]``: tokens cut into blocks, so a case reads the way the allocator sees it."""
    return "[" + " | ".join(" ".join(map(str, tokens[i : i + BS])) for i in range(0, len(tokens), BS)) + "]"


def describe(op) -> str:
    if op[0] == "compute":
        return f"{op[1]} computes {op[2]} more tokens"
    if op[0] == "admit":
        return f"admit {op[1]}"
    if op[0] == "share":
        return f"{op[1]} shares {op[2]}'s first {op[3]} block(s)"
    if op[0] == "find":
        return f"find_cached_blocks({blocks_of(op[1])})"
    return f"{op[0]}({op[1]})" if len(op) > 1 else f"{op[0]}_prefix_cache()"


def check_ops(ch07, num_blocks, prompts, ops, fields=("result",)) -> list[dict]:
    """The learner's allocator and minillm's on ``ops``: no error where minillm's has none, and the
    same ``fields`` after every operation."""
    got = ch07.call(run_my_block_manager, num_blocks, prompts, ops)
    expected = apply_ops(PrefixCachingBlockManager(num_blocks, BS), prompts, ops)
    case = f"num_blocks={num_blocks}, block_size={BS}, prompts " + ", ".join(
        f"{rid}={blocks_of(p)}" for rid, p in prompts.items()
    )
    for i, (op, g, e) in enumerate(zip(ops, got, expected)):
        assert e["error"] is None, f"the case itself is wrong: {e['error']}"
        at = f"operation {i}, {describe(op)}"
        assert g["error"] is None, f"{at}: raised {g['error']} ({case})"
        for field in fields:
            if g[field] != e[field]:
                mismatch = f"{at}: {FIELDS[field]} {g[field]}, expected {e[field]}"
                raise AssertionError(f"{first_divergence(ops[: i + 1], got, expected)}{mismatch} ({case})")
    return got


def first_divergence(ops, got, expected) -> str:
    """Where the learner's block tables first part from minillm's, said first: what the data shows,
    whatever the test is about (a block handed out in another order makes every later comparison differ)."""
    for i, (op, g, e) in enumerate(zip(ops, got, expected)):
        differ = sorted(r for r in g["tables"].keys() | e["tables"].keys() if g["tables"].get(r) != e["tables"].get(r))
        if differ:
            rid = differ[0]
            return (
                f"the block tables part from minillm's at operation {i}, {describe(op)}: {rid} holds "
                f"{g['tables'].get(rid, [])}, minillm's {e['tables'].get(rid, [])} (new blocks come from "
                "take_free_block, the front of the free queue; shared ones from find_cached_blocks). Then "
            )
    return ""


@pytest.mark.hint(
    "hash_block(parent_hash, token_ids) must give one name for the same tokens (list or tuple) after the "
    "same parent, and another name when the tokens or the parent differ.",
    "A list cannot be hashed and a tuple can; the name must come from the parent's name and the tokens "
    "together, as one value.",
)
def test_hash_block_depends_on_the_tokens_and_the_block_before(ch07):
    wrong = [what for what, ok in ch07.call(run_hash_block).items() if not ok]
    assert not wrong, f"hash_block is wrong for: {', '.join(wrong)}"


@pytest.mark.hint(
    "find_cached_blocks hashes the prompt's full blocks in order, each name chained into the next, and "
    "returns the cached block of each, stopping at the first name not cached; cache_full_blocks names them "
    "the same way.",
    "Walk the prompt a block at a time while a whole block is left, each name computed from the one before; "
    "the walk stops at the first name that is not in cached_block_ids.",
)
def test_finds_the_cached_blocks_of_a_shared_prefix(ch07):
    a = list(range(1, 13))  # three full blocks
    prompts = {"a": a, "b": a[:8] + [20, 21, 22], "c": a[:4] + [30, 31]}
    check_ops(
        ch07,
        16,
        prompts,
        [
            ("compute", "a", 12),
            ("find", a + [40]),
            ("find", a[:8] + [41, 42, 43, 44]),
            ("find", a[:5]),
            ("find", [0] + a[1:]),
            ("admit", "b"),
            ("admit", "c"),
        ],
        ("result", "tables"),
    )


@pytest.mark.hint(
    "A block's name must include the name of the block before it (its parent): the same tokens after another "
    "prefix are another block, whose keys and values differ, and must not be found.",
    "The keys and values of block 1 depend on block 0's tokens (attention mixed them in): both "
    "find_cached_blocks and cache_full_blocks must chain the names.",
)
def test_a_prompt_that_differs_in_an_early_block_misses_every_block_after_it(ch07):
    a = list(range(1, 13))
    prompts = {"a": a, "c": [9, 9, 9, 9] + a[4:8] + [7]}
    check_ops(
        ch07,
        16,
        prompts,
        [
            ("compute", "a", 12),
            ("find", [0] + a[1:]),  # only the first token differs: nothing is found
            ("find", a[:4] + [0] + a[5:]),  # the second block differs: only the first is found
            ("find", a[4:]),  # a's second and third blocks' tokens, at the start of a prompt
            ("admit", "c"),  # a's second block's tokens after another first block: computed, not shared
            ("find", [9, 9, 9, 9] + a[4:8]),
            ("find", a[:8]),
        ],
        ("result", "tables"),
    )


@pytest.mark.hint(
    "A block's name chains from the names computed for the blocks before it in its own table, not from the name "
    "stored on the previous block: that one may have none (its name was already another block's), and the block "
    "after it would then be named as if its tokens began a prompt.",
    "In cache_full_blocks carry the chain along the table yourself, hashing every full block in order, whether or "
    "not each one gets its name.",
)
def test_a_block_after_an_unnamed_one_is_named_after_its_whole_prefix(ch07):
    x, y, z = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    check_ops(
        ch07,
        4,
        {"a": x + y, "b": x + z},
        [
            ("compute", "a", 8),
            ("compute", "b", 8),  # b's first block holds x again: that name is a's, so b's block stays unnamed
            ("find", x + z),  # finds a's first block, then b's second
            ("find", z + [13]),  # z was computed after x, never at the start of a prompt: no hit
        ],
        ("result", "named"),
    )


@pytest.mark.hint(
    "Only FULL blocks whose tokens are all computed get a name: num_computed_tokens // block_size of them "
    "(floor, not ceil); a partial block is still being written, and is never named or found.",
    "With chunked prefill a block fills over several steps: a block whose last tokens are not computed yet "
    "is named by a later call of cache_full_blocks, once they are.",
)
def test_a_partial_block_is_never_named_nor_found(ch07):
    a = list(range(1, 11))  # two full blocks and a partial one
    prompts = {"a": a, "b": a[:7] + [50, 51, 52, 53]}
    check_ops(
        ch07,
        16,
        prompts,
        [
            ("compute", "a", 3),  # in chunks, as chunked prefill computes a prompt
            ("compute", "a", 3),
            ("find", a[:8]),
            ("compute", "a", 4),
            ("find", a),
            ("find", a[:9]),
            ("admit", "b"),
        ],
        ("result", "named", "tables"),
    )


@pytest.mark.hint(
    "share_cached_blocks holds each found block once MORE (ref_counts += 1, not = 1), and a held block stays "
    "held: a block in two tables has a reference count of 2, and sharing held blocks frees or takes none.",
    "Sharing blocks another request holds takes nothing from the free queue: num_free_blocks does not change.",
)
def test_a_shared_block_is_held_once_per_table(ch07):
    a = list(range(1, 11))
    prompts = {"a": a, "b": a[:8] + [60], "c": a[:4] + [70, 71]}
    check_ops(
        ch07,
        8,
        prompts,
        [("compute", "a", 10), ("share", "b", "a", 2), ("share", "c", "a", 1), ("compute", "c", 2)],
        ("ref_counts", "num_free", "tables"),
    )


@pytest.mark.hint(
    "free lowers each block's reference count; only a block no table holds any more (count 0) joins the free "
    "queue. A shared block freed by one request still belongs to the other, and is never handed out.",
    "After the first holder frees it, a shared block's count is still at least 1: it stays off the free "
    "queue until its last holder frees it.",
)
def test_freeing_a_shared_block_keeps_it_for_the_other_holder(ch07):
    a = list(range(1, 11))
    prompts = {"a": a, "b": a[:8] + [80, 81, 82, 83, 84], "c": list(range(100, 117))}
    check_ops(
        ch07,
        8,
        prompts,
        [
            ("compute", "a", 10),
            ("admit", "b"),  # shares a's two full blocks, computes two of its own
            ("free", "a"),  # a's shared blocks stay b's; its partial block is free
            ("compute", "c", 17),  # more than is free: allocates nothing
            ("compute", "c", 16),  # every free block, none of b's
            ("find", a[:8]),
            ("free", "b"),
            ("free", "c"),
        ],
        ("result", "num_free", "tables", "ref_counts"),
    )


@pytest.mark.hint(
    "Evict the least recently FREED block first: free adds to the back of the free queue, take_free_block "
    "takes its front (not the most recently freed, nor the block allocated first).",
    "The free queue's order is the order of the frees: blocks never used first, then each freed block behind "
    "the ones freed before it.",
)
def test_eviction_takes_the_least_recently_freed_block_first(ch07):
    prompts = {"a": [1] * 4, "b": [2] * 4, "c": [3] * 4, "d": [4] * 4 + [6] * 4, "e": [5] * 4}
    check_ops(
        ch07,
        4,
        prompts,
        [
            ("compute", "a", 4),
            ("compute", "b", 4),
            ("compute", "c", 4),
            ("free", "c"),
            ("free", "a"),
            ("free", "b"),  # the free queue: the unused block, then c's, a's, b's
            ("find", [1] * 4),
            ("compute", "d", 8),  # takes the unused block and c's
            ("find", [3] * 4),
            ("find", [1] * 4),
            ("compute", "e", 4),  # takes a's
            ("find", [1] * 4),
            ("find", [2] * 4),
        ],
        ("result", "tables", "named"),
    )


@pytest.mark.hint(
    "free puts a request's blocks on the free queue LAST block first (its table reversed): its first block, "
    "the start of every chain of names through it, is evicted last.",
    "Walk the table from its end when freeing: a later prompt that shares the first blocks still finds them "
    "after the tail blocks are taken.",
)
def test_a_request_frees_its_last_block_first(ch07):
    a = list(range(1, 13))
    prompts = {"a": a, "b": [7] * 4 + [13] * 4, "c": [8] * 4}
    check_ops(
        ch07,
        4,
        prompts,
        [
            ("compute", "a", 12),
            ("free", "a"),
            ("compute", "b", 8),  # the unused block and a's last one
            ("find", a),
            ("compute", "c", 4),  # a's second block
            ("find", a),
        ],
        ("result", "tables", "named"),
    )


@pytest.mark.hint(
    "A hit on a free cached block (reference count 0) must take it OUT of the free queue as it is shared: it "
    "is held now, no longer counted free, and never handed out to another request.",
    "A found block whose count is 0 sits in the free queue: it leaves the queue as its count goes to 1, and "
    "num_free_blocks drops by one.",
)
def test_a_hit_takes_a_freed_block_out_of_the_free_queue(ch07):
    a = list(range(1, 9))
    prompts = {"a": a, "b": a + [9], "c": list(range(20, 28)), "d": list(range(30, 34))}
    check_ops(
        ch07,
        4,
        prompts,
        [
            ("compute", "a", 8),
            ("free", "a"),  # a's two blocks: free, named
            ("admit", "b"),  # finds both: they are held again, and b takes one block more
            ("compute", "c", 8),  # two blocks, one free: allocates nothing
            ("compute", "d", 4),  # the last free block, not one of b's
            ("find", a),
        ],
        ("result", "num_free", "tables"),
    )


@pytest.mark.hint(
    "Eviction forgets only the name of the block take_free_block hands out (the front of the free queue): a "
    "block some request holds is never evicted and keeps its name.",
    "take_free_block evicts exactly the block it returns: that block's own name (block_hashes says which) "
    "goes, and no other.",
)
def test_a_held_block_is_never_evicted(ch07):
    prompts = {"a": [1] * 4, "b": [2] * 4, "c": [3] * 4 + [6] * 4, "d": [4] * 4}
    check_ops(
        ch07,
        3,
        prompts,
        [
            ("compute", "a", 4),  # a holds its block to the end
            ("compute", "b", 4),
            ("free", "b"),
            ("compute", "c", 8),  # the unused block and b's, whose name goes
            ("find", [1] * 4),
            ("find", [2] * 4),
            ("find", [3] * 4 + [6] * 4),
            ("compute", "d", 4),  # nothing free: a's block is not taken
            ("find", [1] * 4),
        ],
        ("result", "tables", "named"),
    )


@pytest.mark.hint(
    "reset_prefix_cache: while any request holds a block, change nothing and return False; otherwise forget "
    "every name (no lookup finds anything, cached_block_ids is empty) and return True.",
    "Compare num_free_blocks with num_blocks before forgetting anything; forgetting empties cached_block_ids "
    "and every block's name.",
)
def test_reset_prefix_cache_forgets_every_name_only_when_no_block_is_held(ch07):
    a = list(range(1, 10))
    prompts = {"a": a, "b": a, "c": [5] * 5}
    check_ops(
        ch07,
        6,
        prompts,
        [
            ("compute", "a", 9),
            ("compute", "c", 5),
            ("free", "c"),
            ("reset",),  # a still holds its blocks: refused
            ("find", a),
            ("free", "a"),
            ("reset",),
            ("find", a),
            ("find", [5] * 4),
            ("admit", "b"),  # computes all again, and names its blocks
            ("find", a),
        ],
        ("result", "named", "num_free"),
    )


# --- inside the engine ---------------------------------------------------------------------------------
@cache
def tiny_model():
    """The tiny model, once per process (the grader's and the learner's each load their own)."""
    return LLM("tiny", dtype="float32", device="cpu").model


def prefix_workload(num_requests: int, seed: int) -> Workload:
    """Three system prompts (one ends mid-block), each request one of them plus its own question, the
    same two blocks of instructions after the second and the third; a chat whose every turn resends
    the turn before; and one prompt sent twice. Requests arrive a few steps apart, so later ones find
    what earlier ones computed."""
    rng = random.Random(seed)
    tokens = lambda n: [rng.randrange(1, 256) for _ in range(n)]  # noqa: E731
    systems, instructions = [tokens(10), tokens(12), tokens(8)], tokens(8)
    prompts = [
        systems[i % 3] + (instructions if i % 3 else []) + tokens(rng.randrange(1, 7)) for i in range(num_requests)
    ]
    chat = tokens(6)
    for _ in range(3):
        prompts.append(chat)
        chat = chat + tokens(rng.randrange(3, 6))
    prompts.append(prompts[0])
    params = [SamplingParams(max_tokens=rng.randrange(3, 7), ignore_eos=True) for _ in prompts]
    return Workload(prompts, params, [0.05 * i for i in range(len(prompts))])


def run_engine(name, workload, scheduler_cls=None, **options) -> dict:
    """``workload`` through engine ``name``: each request's tokens and cached tokens, the allocator's
    class and its blocks at the end, and the error that stopped the run, if any."""
    engine = build_engine(
        name, tiny_model(), torch.device("cpu"), None, scheduler_cls=scheduler_cls, attention_backend="torch", **options
    )
    engine.clock = TickClock()
    requests = [
        Request(str(i), p, sp, t, seed=i)
        for i, (p, sp, t) in enumerate(zip(workload.prompts, workload.sampling_params, workload.arrival_times))
    ]
    error = None
    max_steps = 10 * sum(len(p) + sp.max_tokens for p, sp in zip(workload.prompts, workload.sampling_params))
    try:
        for r in requests:
            engine.add_request(r)
        for _ in range(max_steps):
            if not engine.has_unfinished_requests():
                break
            engine.step(stream=False)
        else:
            raise RuntimeError(f"no progress: after {max_steps} engine steps, some requests had not finished")
    except NotImplementedError:
        raise
    except Exception as err:
        error = f"{type(err).__name__}: {err}"
    bm = engine.scheduler.block_manager
    return {
        "tokens": [r.output_token_ids for r in requests],
        "num_cached_tokens": [r.num_cached_tokens or 0 for r in requests],
        "allocator": type(bm).__name__,
        "num_free": bm.num_free_blocks,
        "num_blocks": bm.num_blocks,
        "held": sorted(b for b, n in enumerate(bm.ref_counts) if n),
        "tables": {rid: list(t) for rid, t in bm.block_tables.items() if t},
        "error": error,
    }


# The runs: (engine, workload, options). The first two have blocks to spare (no named block is ever
# evicted: the hits are fixed by the contract); the last two run short of blocks, with preemptions and
# evictions.
RUNS = {
    "chunked": ("chunked", (8, 1), dict(block_size=4, num_gpu_blocks=128, max_num_seqs=4, max_num_batched_tokens=16)),
    "paged": ("paged", (8, 2), dict(block_size=4, num_gpu_blocks=128, max_num_seqs=3)),
    "chunked, short of blocks": (
        "chunked",
        (12, 3),
        dict(block_size=4, num_gpu_blocks=14, max_num_seqs=4, max_num_batched_tokens=12),
    ),
    "paged, short of blocks, swap": (
        "paged",
        (12, 4),
        dict(block_size=4, num_gpu_blocks=13, max_num_seqs=4, preemption_mode="swap"),
    ),
}
WITH_BLOCKS_TO_SPARE = ("chunked", "paged")


def run_engine_with_your_allocator(ch07, name, workload, **options):
    """Your scheduler in the chunked engine; in the paged engine, its scheduler on your allocator."""
    if name == "chunked":
        scheduler_cls = ch07.MyPrefixCachingScheduler
    else:
        scheduler_cls = type(
            "PagedScheduler", (PagedScheduler,), {"prefix_caching_block_manager_cls": ch07.MyPrefixCachingBlockManager}
        )
    return run_engine(name, workload, scheduler_cls, enable_prefix_caching=True, **options)


@cache
def your_run(ch07, run: str) -> dict:
    name, (n, seed), options = RUNS[run]
    return ch07.call(run_engine_with_your_allocator, name, prefix_workload(n, seed), **options)


@cache
def minillm_run(run: str, enable_prefix_caching: bool) -> dict:
    name, (n, seed), options = RUNS[run]
    out = run_engine(name, prefix_workload(n, seed), enable_prefix_caching=enable_prefix_caching, **options)
    assert out["error"] is None, out["error"]
    return out


def check_ran(got: dict, run: str) -> None:
    if got["error"]:
        raise AssertionError(f"{run}: the engine stopped with your allocator: {got['error']}")
    assert got["allocator"] == "MyPrefixCachingBlockManager", (
        f"{run}: the engine ran on {got['allocator']}, not your MyPrefixCachingBlockManager"
    )


@pytest.mark.points(2)
@pytest.mark.hint(
    "With your allocator the engine generated other tokens than with the cache off: a request read blocks "
    "that do not hold its tokens (a wrong name, a partial block named, a held block handed out or evicted).",
    "Run the workload yourself with LLM(..., enable_prefix_caching=True, "
    "scheduler_cls=MyPrefixCachingScheduler) and with enable_prefix_caching=False, and compare; the "
    "hand-made tests above name the mistake more precisely.",
)
def test_caching_changes_no_token_in_the_engine(ch07):
    for run in RUNS:
        got, off = your_run(ch07, run), minillm_run(run, False)
        check_ran(got, run)
        for i, (g, e) in enumerate(zip(got["tokens"], off["tokens"])):
            assert g == e, f"{run}: request {i} generated {g} with your allocator, {e} with the cache off"


@pytest.mark.points(2)
@pytest.mark.hint(
    "In the engine, each request must find as many cached tokens as with minillm's allocator "
    "(num_cached_tokens): a request that shares full blocks with an earlier one finds them, up to the first "
    "block it does not share.",
    "Fewer cached tokens than minillm's: a lookup stops too early, or names were lost (evicted from held or "
    "the wrong blocks). More: blocks were named that must not be (a partial block, a name without its "
    "parent).",
)
def test_later_requests_find_the_shared_prefix_in_the_engine(ch07):
    for run in WITH_BLOCKS_TO_SPARE:
        got, theirs = your_run(ch07, run), minillm_run(run, True)
        check_ran(got, run)
        assert any(got["num_cached_tokens"]), f"{run}: no request found a cached token with your allocator"
        assert got["num_cached_tokens"] == theirs["num_cached_tokens"], (
            f"{run}: cached tokens per request {got['num_cached_tokens']} with your allocator, "
            f"{theirs['num_cached_tokens']} with minillm's"
        )


@pytest.mark.hint(
    "When every request has finished, every block is free again (reference counts 0, no table left): free "
    "must give back each reference a request holds, shared or not, and each block exactly once.",
    "At the end sum(ref_counts) must be 0 and num_free_blocks == num_blocks: a block that joins the free "
    "queue twice, or never, breaks it.",
)
def test_every_block_is_free_when_all_requests_finish_in_the_engine(ch07):
    for run in RUNS:
        got = your_run(ch07, run)
        check_ran(got, run)
        assert not got["tables"] and not got["held"], (
            f"{run}: after every request finished, blocks {got['held']} are still held (tables {got['tables']})"
        )
        assert got["num_free"] == got["num_blocks"], (
            f"{run}: after every request finished, num_free_blocks is {got['num_free']}, not all {got['num_blocks']}"
        )
