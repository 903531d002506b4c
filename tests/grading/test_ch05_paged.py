"""Grading tests for chapter 5 (``MyBlockManager`` and ``slot_mapping``).

The learner's code runs in a child process (``minillm.course.sandbox``): the ``run_*`` probes
below drive it there and return plain data. The oracles are minillm's own: ``BlockManager`` runs
the same allocations here (which block ids a request gets is the learner's choice, so the tests
compare what the contract fixes: success, blocks held, blocks free, no block held twice), the
slot mapping is computed here from its formula, and minillm's paged engine runs the same
requests with its own allocator and slot mapping.
"""

from functools import cache

import pytest
import torch

from minillm import LLM, workloads
from minillm.course.sandbox import LearnerProcess, type_name
from minillm.engines import build_engine
from minillm.engines.paged import PagedScheduler
from minillm.kv.block_manager import BlockManager
from minillm.request import Request
from minillm.sim.clock import TickClock

PREEMPT_IDEA = (
    "The idea: preemption undoes admission for the newest running request: it leaves the running list, "
    "its slot and its blocks, and waits at the front of its queue, either to be prefilled again "
    "(recompute) or to have its blocks copied back (swap)."
)
# The last rung of each test's hint ladder (check(..., hint=N)): the idea, never the code. A test
# gets the idea of the longest key in its name, else the "*" one.
IDEAS = {
    "*": (
        "The idea: a request holds as many blocks as its computed and new tokens need; a step gets all the "
        "blocks it is missing or none at all, and freed blocks go back to be handed out again."
    ),
    "slot_mapping": (
        "The idea: a token's position says which of its request's blocks it falls in and where in that block; "
        "the request's table says where that block sits in the pool."
    ),
    "preempt": PREEMPT_IDEA,
    "recompute": PREEMPT_IDEA,
    "swap": PREEMPT_IDEA,
    "two_victims": PREEMPT_IDEA,
}


@pytest.fixture(scope="module")
def ch05():
    with LearnerProcess("ch05_paged") as learner:
        yield learner


class FakeRequest:
    """What an allocator reads of a request: its id and how many of its tokens are cached."""

    def __init__(self, request_id: str, num_computed_tokens: int = 0):
        self.request_id, self.num_computed_tokens = request_id, num_computed_tokens
        self.max_num_tokens = 1 << 30  # minillm's BlockManager checks it


def apply_ops(bm, ops) -> list[dict]:
    """Run ``ops`` on an allocator: ``("alloc", request id, num_computed_tokens, num_new_tokens)`` or
    ``("free", request id)``; after each, the result (or the error) and every table and the free count."""
    requests, results = {}, []
    for op in ops:
        rid = op[1]
        request = requests.setdefault(rid, FakeRequest(rid))
        try:
            if op[0] == "alloc":
                request.num_computed_tokens = op[2]
                result = bm.allocate_slots(request, op[3])
            else:
                result = bm.free(request)
                result = list(result) if result is not None else None
            error = None
        except NotImplementedError:
            raise
        except Exception as err:
            result, error = None, type(err).__name__
        results.append(
            {
                "result": result,
                "error": error,
                "num_free": bm.num_free_blocks,
                "tables": {r: list(bm.get_block_table(r)) for r in requests},
            }
        )
    return results


@cache
def tiny_model():
    return LLM("tiny", dtype="float32", device="cpu").model


def run_paged_engine(workload, scheduler_cls=None, runner_cls=None, **options) -> dict:
    """``workload`` through the paged engine: each step's plan, preemptions and blocks held per
    request, each request's tokens, and the error that stopped the run, if any."""
    engine = build_engine(
        "paged",
        tiny_model(),
        torch.device("cpu"),
        None,
        scheduler_cls=scheduler_cls,
        runner_cls=runner_cls,
        attention_backend="torch",
        **options,
    )
    engine.clock = TickClock()
    requests = [
        Request(str(i), p, sp, t, seed=i)
        for i, (p, sp, t) in enumerate(zip(workload.prompts, workload.sampling_params, workload.arrival_times))
    ]
    steps, error = [], None
    try:
        for r in requests:
            engine.add_request(r)
        while engine.has_unfinished_requests():  # run_to_completion's loop, looking at the allocator after every step
            num_steps = engine.num_steps
            engine.step(stream=False)
            if engine.num_steps == num_steps:
                continue  # it only waited for an arrival
            s = engine.trace[-1]
            bm = engine.scheduler.block_manager
            steps.append(
                {
                    "plan": s.num_scheduled_tokens,
                    "preempted": s.preempted_ids,
                    "num_free": bm.num_free_blocks,
                    "held": {rid: len(t) for rid, t in bm.block_tables.items()},
                }
            )
    except NotImplementedError:
        raise
    except Exception as err:
        error = f"{type(err).__name__}: {err}"
    return {"steps": steps, "tokens": [r.output_token_ids for r in requests], "error": error}


# --- probes: these run in the learner's process ------------------------------------------------
def run_my_block_manager(ch05, num_blocks, block_size, ops):
    return apply_ops(ch05.MyBlockManager(num_blocks, block_size), ops)


def run_slot_mapping(ch05, block_tables, num_computed_tokens, num_scheduled_tokens, block_size):
    return ch05.slot_mapping(block_tables, num_computed_tokens, num_scheduled_tokens, block_size)


# One piece of the learner's at a time, on minillm's version of the other: a mistake in one piece
# fails only that piece's tests.
def run_engine_with_your_allocator(ch05, workload, **options):
    return run_paged_engine(workload, ch05.MyBlockManagerScheduler, None, **options)


def run_engine_with_your_slot_mapping(ch05, workload, **options):
    return run_paged_engine(workload, None, ch05.SlotMappingRunner, **options)


def run_engine_with_your_preempt(ch05, workload, **options):
    return run_paged_engine(workload, ch05.MyPreemptingScheduler, None, **options)


def run_your_preempt(ch05, mode, num_victims):
    return preempt_scenario(ch05.MyPreemptingScheduler, mode, num_victims)


def preempt_scenario(scheduler_cls, mode, num_victims) -> dict:
    """Three requests running (A, B, C, admitted in that order, each with its prompt computed and one
    token generated) and D waiting for a slot; then ``num_victims`` calls of ``preempt``. Returns
    what they returned and the scheduler's state after them, as plain data."""
    from minillm import SamplingParams
    from minillm.request import RequestStatus

    scheduler = scheduler_cls(max_num_seqs=3, block_size=4, num_gpu_blocks=10, preemption_mode=mode)
    requests = [
        Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=8), 0.0) for rid, n in zip("ABCD", (6, 5, 3, 4))
    ]
    for r in requests:
        scheduler.add_request(r)
    scheduler.schedule(0.0)
    for r in requests[:3]:  # what the engine does after the step: prompts computed, one token each
        r.num_computed_tokens = r.num_tokens
        r.append_output_token_ids(7)
    scheduler.schedule(0.0)  # a decode step: each gets the block of its next token
    tables = {r.request_id: list(scheduler.block_manager.get_block_table(r.request_id)) for r in requests}
    preempted, swap_out = [], {}
    victims = [scheduler.preempt(preempted, swap_out).request_id for _ in range(num_victims)]
    bm = scheduler.block_manager
    return {
        "tables_before": tables,
        "victims": victims,
        "preempted": preempted,
        "swap_out": {k: list(v) for k, v in swap_out.items()},
        "running": [r.request_id for r in scheduler.running],
        "waiting": [r.request_id for r in scheduler.waiting],
        "swapped": [r.request_id for r in scheduler.swapped],
        "slots": dict(scheduler.slots),
        "status": {r.request_id: r.status.name for r in requests},
        "num_computed_tokens": {r.request_id: r.num_computed_tokens for r in requests},
        "output_token_ids": {r.request_id: list(r.output_token_ids) for r in requests},
        "held": {rid: len(t) for rid, t in bm.block_tables.items()},
        "num_free": bm.num_free_blocks,
        "num_preemptions": scheduler.num_preemptions,
        "num_swapped_out": scheduler.num_swapped_out,
        "waiting_status": RequestStatus.WAITING.name,
    }


# --- checks: these run here --------------------------------------------------------------------
def describe(op) -> str:
    return f"allocate_slots({op[1]}, {op[3]}) with {op[2]} tokens cached" if op[0] == "alloc" else f"free({op[1]})"


def check_allocator(ch05, num_blocks, block_size, ops) -> list[dict]:
    """The learner's allocator and minillm's on ``ops``: same results, same number of blocks held
    and free after every operation; tables only grow at their end; no block held twice."""
    got = ch05.call(run_my_block_manager, num_blocks, block_size, ops)
    expected = apply_ops(BlockManager(num_blocks, block_size), ops)
    before = {}
    where = f"num_blocks={num_blocks}, block_size={block_size}"
    for i, (op, g, e) in enumerate(zip(ops, got, expected)):
        at = f"{where}, operation {i}, {describe(op)}"
        if e["error"]:
            assert g["error"] == e["error"], f"{at}: should raise {e['error']}, got {g['error'] or repr(g['result'])}"
        else:
            assert g["error"] is None, f"{at}: raised {g['error']}"
        if op[0] == "alloc":
            assert isinstance(g["result"], bool) and g["result"] == e["result"], (
                f"{at}: returned {g['result']!r}, expected {e['result']}"
            )
        elif not e["error"]:
            assert g["result"] == before.get(op[1]), (
                f"{at}: should return the freed table {before.get(op[1])}, got {g['result']!r}"
            )
        held = {r: len(t) for r, t in g["tables"].items()}
        expected_held = {r: len(t) for r, t in e["tables"].items()}
        assert held == expected_held, f"{at}: blocks held per request {held}, expected {expected_held}"
        assert g["num_free"] == e["num_free"], f"{at}: num_free_blocks is {g['num_free']}, expected {e['num_free']}"
        blocks = [b for t in g["tables"].values() for b in t]
        assert len(blocks) == len(set(blocks)), f"{at}: a block is held twice: tables {g['tables']}"
        assert all(isinstance(b, int) and 0 <= b < num_blocks for b in blocks), (
            f"{at}: tables {g['tables']} hold a block outside 0..{num_blocks - 1}"
        )
        for r, t in g["tables"].items():
            assert t[: len(before.get(r, []))] == before.get(r, []) or not t, (
                f"{at}: request {r}'s table went from {before.get(r)} to {t}: new blocks go at its end, held ones stay"
            )
        before = g["tables"]
    return got


@pytest.mark.hint(
    "Blocks needed = ceil((num_computed_tokens + num_new_tokens) / block_size); allocate only those not held yet."
)
def test_allocates_just_in_time(ch05):
    check_allocator(
        ch05,
        8,
        4,
        [
            ("alloc", "a", 0, 5),
            ("alloc", "a", 5, 1),
            ("alloc", "a", 6, 2),
            ("alloc", "b", 0, 3),
            ("alloc", "b", 3, 1),
            ("alloc", "a", 8, 0),
        ],
    )


@pytest.mark.hint(
    "A token at a multiple of block_size opens a new block: position 8 with block_size 4 is block 2 (ceil, not floor "
    "+ 0)."
)
def test_a_new_block_exactly_at_a_multiple_of_block_size(ch05):
    check_allocator(
        ch05, 8, 4, [("alloc", "a", 0, 4), ("alloc", "a", 4, 1), ("alloc", "a", 5, 3), ("alloc", "a", 8, 1)]
    )
    check_allocator(ch05, 8, 2, [("alloc", "a", 0, 1), ("alloc", "a", 1, 1), ("alloc", "a", 2, 1)])


@pytest.mark.hint("An exact fit succeeds: a request may take the very last free block (missing <= free, not <).")
def test_exact_fit_of_the_last_free_block(ch05):
    check_allocator(ch05, 3, 4, [("alloc", "a", 0, 8), ("alloc", "b", 0, 4)])
    check_allocator(ch05, 3, 4, [("alloc", "a", 0, 12)])


@pytest.mark.hint(
    "When too few blocks are free, return False and allocate NOTHING (check before taking any block): "
    "one token more than the free blocks hold fails."
)
def test_one_token_too_many_fails_and_allocates_nothing(ch05):
    check_allocator(ch05, 3, 4, [("alloc", "a", 0, 8), ("alloc", "b", 0, 5), ("alloc", "b", 0, 4)])
    check_allocator(ch05, 3, 4, [("alloc", "a", 0, 13)])
    check_allocator(ch05, 3, 4, [("alloc", "a", 0, 4), ("alloc", "a", 4, 9), ("alloc", "a", 4, 8)])


@pytest.mark.hint("block_size 1: every token is a block of its own.")
def test_block_size_one(ch05):
    check_allocator(
        ch05,
        5,
        1,
        [
            ("alloc", "a", 0, 3),
            ("alloc", "a", 3, 1),
            ("alloc", "b", 0, 2),
            ("alloc", "a", 4, 1),
            ("free", "a"),
            ("alloc", "b", 2, 4),
        ],
    )


@pytest.mark.hint(
    "free(request) puts every block of its table back on the free list (for reuse), removes the table and returns it."
)
def test_freed_blocks_are_reused(ch05):
    got = check_allocator(
        ch05,
        4,
        2,
        [
            ("alloc", "a", 0, 5),
            ("alloc", "b", 0, 2),
            ("alloc", "c", 0, 3),
            ("free", "a"),
            ("alloc", "c", 0, 3),
            ("alloc", "d", 0, 2),
            ("free", "b"),
            ("free", "d"),
        ],
    )
    assert got[-1]["num_free"] == 2  # c's two blocks are all that is held


@pytest.mark.hint(
    "Freeing a request that holds no blocks (freed already, or never allocated) is a double free: raise ValueError."
)
def test_double_free_raises(ch05):
    check_allocator(ch05, 4, 2, [("alloc", "a", 0, 3), ("free", "a"), ("free", "a"), ("alloc", "a", 0, 8)])
    check_allocator(ch05, 4, 2, [("free", "x")])


def check_slot_mapping(ch05, block_tables, num_computed_tokens, num_scheduled_tokens, block_size):
    got = ch05.call(run_slot_mapping, block_tables, num_computed_tokens, num_scheduled_tokens, block_size)
    expected = [
        t[p // block_size] * block_size + p % block_size
        for t, s, n in zip(block_tables, num_computed_tokens, num_scheduled_tokens)
        for p in range(s, s + n)
    ]
    if isinstance(got, torch.Tensor):
        assert got.dim() == 1 and not got.is_floating_point(), (
            f"return a 1-D integer tensor or a list of ints, got {got!r}"
        )
        got = got.tolist()
    assert isinstance(got, (list, tuple)), f"return a list of ints (or a 1-D integer tensor), got {type_name(got)}"
    assert list(got) == expected, (
        f"slot_mapping({block_tables}, {num_computed_tokens}, {num_scheduled_tokens}, "
        f"block_size={block_size}) should be {expected}, got {list(got)}"
    )


@pytest.mark.hint(
    "Slot = block_table[p // block_size] * block_size + p % block_size, for positions p of the step's tokens."
)
def test_slot_mapping_one_prefill(ch05):
    check_slot_mapping(ch05, [[3, 0, 5]], [0], [10], 4)
    check_slot_mapping(ch05, [[2, 4, 1]], [0], [3], 1)


@pytest.mark.hint(
    "The step's tokens start at position num_computed_tokens, not 0: a chunk or a decode may start mid-block."
)
def test_slot_mapping_chunk_starting_mid_block(ch05):
    check_slot_mapping(ch05, [[7, 2]], [3], [2], 4)  # positions 3 and 4: across the block boundary
    check_slot_mapping(ch05, [[6, 1, 3]], [9], [1], 4)  # one decode token, in the third block
    check_slot_mapping(ch05, [[5, 0]], [4], [4], 4)  # a chunk that starts a block exactly


@pytest.mark.hint(
    "Several sequences: request i's tokens use request i's own table, in order, one after another (flat)."
)
def test_slot_mapping_several_sequences(ch05):
    check_slot_mapping(ch05, [[7, 2], [5]], [3, 0], [2, 2], 4)  # the docstring's example
    check_slot_mapping(ch05, [[0, 1, 2], [9], [4, 8], [3]], [0, 6, 13, 2], [10, 1, 2, 1], 8)


def assert_same_engine_run(ch05, workload, piece, **options):
    """``workload`` through the paged engine with the learner's ``piece`` ("MyBlockManager",
    "slot_mapping" or "preempt") and minillm's other pieces, step by step against minillm's own run."""
    probe = {
        "MyBlockManager": run_engine_with_your_allocator,
        "slot_mapping": run_engine_with_your_slot_mapping,
        "preempt": run_engine_with_your_preempt,
    }[piece]
    got = ch05.call(probe, workload, **options)
    expected = run_paged_engine(workload, **options)
    assert expected["error"] is None and expected["steps"], expected["error"]
    for step, (g, e) in enumerate(zip(got["steps"], expected["steps"])):
        assert g["plan"] == e["plan"], (
            f"{options}, step {step}: with your {piece} the engine planned {g['plan']}, expected {e['plan']}"
        )
        assert g["preempted"] == e["preempted"], (
            f"{options}, step {step}: preempted {g['preempted']}, expected {e['preempted']}"
        )
        assert g["held"] == e["held"], (
            f"{options}, step {step}: blocks held per request {g['held']}, expected {e['held']}"
        )
        assert g["num_free"] == e["num_free"], (
            f"{options}, step {step}: {g['num_free']} blocks free, expected {e['num_free']}"
        )
    if got["error"]:
        raise AssertionError(
            f"{options}: the engine stopped at step {len(got['steps'])} with your {piece}: {got['error']}"
        )
    assert len(got["steps"]) == len(expected["steps"]), (
        f"{options}: the run took {len(got['steps'])} steps, expected {len(expected['steps'])}"
    )
    for i, (g, e) in enumerate(zip(got["tokens"], expected["tokens"])):
        assert g == e, f"{options}: request {i} generated {g} with your {piece}, expected {e}"


# Eight requests on a pool too small for them all: blocks run out and requests are preempted.
PRESSURE = dict(prompt_lens=[7, 3, 11, 2, 9, 5, 4, 6], output_lens=[9, 12, 5, 14, 6, 10, 8, 7])


@pytest.mark.points(2)
@pytest.mark.hint(
    "In the paged engine your allocator must behave as minillm's: same blocks held and free at every step, "
    "so the same requests are admitted and preempted (recompute and swap)."
)
def test_my_block_manager_runs_the_paged_engine(ch05):
    w = workloads.fixed(**PRESSURE, seed=1)
    mine = "MyBlockManager"
    assert_same_engine_run(ch05, w, mine, max_num_seqs=6, block_size=4, num_gpu_blocks=12)
    assert_same_engine_run(ch05, w, mine, max_num_seqs=6, block_size=4, num_gpu_blocks=12, preemption_mode="swap")
    assert_same_engine_run(ch05, w, mine, max_num_seqs=4, block_size=1, num_gpu_blocks=40)


@pytest.mark.points(2)
@pytest.mark.hint(
    "Inside the engine, a wrong slot writes keys and values where attention does not read them: the tokens change."
)
def test_slot_mapping_runs_the_paged_engine(ch05):
    w = workloads.fixed(**PRESSURE, seed=1)
    mine = "slot_mapping"
    assert_same_engine_run(ch05, w, mine, max_num_seqs=6, block_size=4, num_gpu_blocks=12)
    assert_same_engine_run(ch05, w, mine, max_num_seqs=3, block_size=2, num_gpu_blocks=16, preemption_mode="swap")


# --- preemption ------------------------------------------------------------------------------------
def check_preempt(ch05, mode, num_victims, *fields):
    """Your ``preempt`` in the scenario of ``preempt_scenario``, against minillm's, on ``fields``."""
    got = ch05.call(run_your_preempt, mode, num_victims)
    expected = preempt_scenario(PagedScheduler, mode, num_victims)
    case = (
        f"running [A, B, C] (admitted in that order, block tables {expected['tables_before']}), waiting [D], "
        f"preemption_mode={mode!r}, after {num_victims} call(s) of preempt"
    )
    for field in fields:
        assert got[field] == expected[field], f"{case}: {field} is {got[field]}, expected {expected[field]}"


@pytest.mark.hint("preempt takes the running request of lowest priority: the one admitted last, at the end of running.")
def test_preempt_takes_the_request_admitted_last(ch05):
    check_preempt(ch05, "recompute", 1, "victims", "running", "preempted")


@pytest.mark.hint(
    "A preempted request holds nothing: give its blocks back to the block manager and its batch slot "
    "back (release_slot), set its status to WAITING and count it in num_preemptions."
)
def test_preempt_gives_back_blocks_and_slot(ch05):
    check_preempt(ch05, "recompute", 1, "held", "num_free", "slots", "status", "num_preemptions")


@pytest.mark.hint(
    "Recompute drops the victim's keys and values: it waits first in line (before any new request) with "
    "num_computed_tokens 0, and keeps the tokens it generated."
)
def test_recompute_puts_it_first_in_line_with_nothing_computed(ch05):
    check_preempt(ch05, "recompute", 1, "waiting", "num_computed_tokens", "output_token_ids", "swapped")


@pytest.mark.hint(
    "Swap keeps the victim's progress: swap_out[its id] lists the blocks of its computed tokens, read "
    "BEFORE freeing them; it goes first in swapped, num_computed_tokens unchanged, counted in num_swapped_out."
)
def test_swap_lists_its_blocks_and_keeps_its_progress(ch05):
    check_preempt(
        ch05, "swap", 1, "victims", "swap_out", "swapped", "waiting", "num_computed_tokens", "num_swapped_out", "held"
    )


@pytest.mark.hint(
    "Two preemptions in one step: each victim goes to the FRONT of its queue, so the one admitted "
    "earlier (preempted second) ends up first."
)
def test_two_victims_leave_the_earlier_admitted_first(ch05):
    check_preempt(ch05, "recompute", 2, "victims", "waiting", "running")
    check_preempt(ch05, "swap", 2, "victims", "swapped", "swap_out")


@pytest.mark.points(2)
@pytest.mark.hint(
    "Under pool pressure the engine with your preempt must run as minillm's: the same plans, preemptions "
    "and blocks at every step, and the same tokens, by recompute and by swap."
)
def test_preempt_runs_the_paged_engine_under_pool_pressure(ch05):
    w = workloads.fixed(**PRESSURE, seed=1)
    assert_same_engine_run(ch05, w, "preempt", max_num_seqs=6, block_size=4, num_gpu_blocks=12)
    assert_same_engine_run(ch05, w, "preempt", max_num_seqs=6, block_size=4, num_gpu_blocks=12, preemption_mode="swap")
