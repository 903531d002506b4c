"""``kv_memory_use`` and ``draw_kv_memory``: the waste figure chapter 5 quotes, from a trace."""

import matplotlib

matplotlib.use("Agg")

import pytest

from minillm import workloads
from minillm.trace import StepRecord, Trace
from minillm.widgets import draw_kv_memory, kv_memory_use, kv_waste_by_cause


def trace_of(rows):
    trace = Trace()
    for i, (held, allocated) in enumerate(rows):
        trace.record(StepRecord(i, float(i), i + 1.0, {}, [], [], kv_tokens=held, kv_allocated_tokens=allocated))
    return trace


def test_sums_over_steps_and_reports_the_unused_share():
    use = kv_memory_use(trace_of([(10, 40), (30, 40), (0, 0)]))
    assert (use.held, use.allocated) == (40, 80)
    assert use.waste == pytest.approx(0.5)


def test_a_what_if_allocation_replaces_the_traces():
    use = kv_memory_use(trace_of([(10, 40), (30, 40)]), allocated_per_step=[100, 100])
    assert use.allocated == 200 and use.waste == pytest.approx(0.8)


def test_an_empty_run_wastes_nothing():
    assert kv_memory_use(Trace()).waste == 0.0


def test_paging_wastes_less_than_a_reservation_on_a_real_run(tiny, engine_on):
    w = workloads.mix_workload("uniform", 6, seed=1)
    waste = {}
    for engine in ("selective", "paged"):
        llm = engine_on(tiny, engine, max_num_seqs=3)
        llm.generate(w.prompts, w.sampling_params, w.arrival_times)
        waste[engine] = kv_memory_use(llm.trace)
    assert waste["paged"].held == waste["selective"].held  # the same plan: the same tokens in the cache
    assert waste["paged"].waste < waste["selective"].waste


def test_the_drawing_labels_each_run_with_its_waste():
    ax = draw_kv_memory({"a": trace_of([(1, 2), (2, 4)]), "b": trace_of([(2, 2)])})
    labels = [line.get_label() for line in ax.lines]
    assert labels == ["a: set aside (50% unused)", "a: tokens in it", "b: set aside (0% unused)", "b: tokens in it"]


def test_the_block_size_sweep_draws_waste_running_and_throughput_per_size():
    from minillm.widgets import draw_block_size_sweep

    rows = [
        {"block_size": b, "waste": w, "mean_running": m, "tps": t}
        for b, w, m, t in ((8, 0.01, 27.0, 6700), (64, 0.1, 25.0, 6300), (256, 0.4, 18.0, 4900))
    ]
    fig = draw_block_size_sweep(rows, title="t")
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines()}
    assert list(lines["waste"].get_xdata()) == [8, 64, 256]
    assert list(lines["waste"].get_ydata()) == pytest.approx([1.0, 10.0, 40.0])  # percent
    assert list(lines["running"].get_ydata()) == [27.0, 25.0, 18.0]
    assert list(lines["tps"].get_ydata()) == [6700, 6300, 4900]


def test_the_memory_sweep_draws_a_line_per_engine():
    from minillm.widgets import draw_memory_sweep

    runs = {
        e: [{"memory_gib": g, "mean_running": m, "tps": t} for g, m, t in rows]
        for e, rows in (
            ("contiguous", [(0.25, 6.9, 2040), (1, 24.3, 6231)]),
            ("paged", [(0.25, 8.0, 2326), (1, 26.8, 6725)]),
        )
    }
    fig = draw_memory_sweep(runs)
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines()}
    assert list(lines["running-paged"].get_ydata()) == [8.0, 26.8]
    assert list(lines["tps-contiguous"].get_xdata()) == [0.25, 1]


# --- waste by cause -------------------------------------------------------------------------


def step(i, scheduled, **fields):
    return StepRecord(i, float(i), i + 1.0, scheduled, [], [], **fields)


def test_a_reservation_splits_into_tokens_reserved_and_never_filled():
    # one request: a 3-token prompt, 3 output tokens, 6 slots reserved (prompt + max_tokens); it
    # stores at most 5 tokens (its last output is never fed back), so slot 5 is never filled
    trace = Trace()
    for row in (
        step(0, {"0": 3}, slots={"0": 0}),
        step(1, {"0": 1}, slots={"0": 0}),
        step(2, {"0": 1}, slots={"0": 0}, finished_ids=["0"]),  # finished: its reservation is back
    ):
        trace.record(row)
    split = kv_waste_by_cause(trace, reservation={"0": 6})
    # step 0: 3 tokens, 2 reserved, 1 never filled; step 1: 4, 1, 1; step 2: nothing held
    assert (split.tokens, split.reserved, split.internal) == (7, 3, 2)
    assert split.allocated == 12 and split.shares()["internal"] == pytest.approx(2 / 12)


def test_blocks_split_by_the_tables_the_trace_carries_forward():
    trace = Trace()
    trace.block_size = 4
    for row in (
        step(0, {"0": 3}, block_tables={"0": [0]}),
        step(1, {"0": 1}),  # no table change: [0] carries forward
        step(2, {"0": 1}, block_tables={"0": [0, 1]}),
        step(3, {"0": 1}, block_tables={}, finished_ids=["0"]),
    ):
        trace.record(row)
    split = kv_waste_by_cause(trace)  # stores at most 6 tokens: slots 6 and 7 of block 1 are never filled
    assert (split.tokens, split.reserved, split.internal) == (3 + 4 + 5, 1 + 0 + 1, 0 + 0 + 2)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_preempted_request_counts_its_tokens_once(mode):
    trace = Trace()
    trace.block_size = 4
    swapped = ["1"] if mode == "swap" else []
    for row in (
        step(0, {"1": 5}, block_tables={"1": [0, 1]}),
        step(1, {}, block_tables={}, preempted_ids=["1"], swapped_out_ids=swapped),
        # back: recompute runs its 5 tokens again; swap copies them back and computes nothing
        step(2, {"1": 5} if mode == "recompute" else {}, block_tables={"1": [2, 3]}),
    ):
        trace.record(row)
    split = kv_waste_by_cause(trace)
    assert (split.tokens, split.reserved, split.internal) == (10, 0, 6)


def test_the_split_accounts_for_every_slot_of_real_runs(tiny, engine_on):
    w = workloads.mix_workload("uniform", 6, seed=1)
    longest = max(-(-(len(prompt) + p.max_tokens) // 4) for prompt, p in zip(w.prompts, w.sampling_params))
    splits, uses = {}, {}
    for name, engine, options in (
        ("selective", "selective", {}),
        ("paged", "paged", {"block_size": 4}),
        ("preempting", "paged", {"block_size": 4, "num_gpu_blocks": longest * 3 // 2}),
    ):
        llm = engine_on(tiny, engine, max_num_seqs=3, **options)
        outputs = llm.generate(w.prompts, w.sampling_params, w.arrival_times)
        reserve = {o.request_id: len(o.prompt_token_ids) + p.max_tokens for o, p in zip(outputs, w.sampling_params)}
        splits[name] = kv_waste_by_cause(llm.trace, reserve if engine == "selective" else None)
        uses[name] = kv_memory_use(llm.trace)
        if name == "preempting":
            assert llm.stats()["num_preemptions"] > 0
    for name, split in splits.items():
        assert (split.tokens, split.allocated) == (uses[name].held, uses[name].allocated), name
    # the last token a request generates is never stored: one slot of each reservation stays empty
    assert splits["selective"].internal > 0
    assert splits["paged"].reserved + splits["paged"].internal < splits["selective"].reserved


def test_the_waste_bars_draw_each_cause_as_its_share():
    from minillm.widgets import draw_kv_waste_by_cause
    from minillm.widgets.kv_memory import KVWasteByCause

    ax = draw_kv_waste_by_cause({"reserving": KVWasteByCause(20, 60, 20), "paged": KVWasteByCause(90, 10, 0)})
    bars = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    assert bars["tokens:reserving"].get_width() == pytest.approx(20)
    assert bars["reserved:reserving"].get_x() == pytest.approx(20)
    assert bars["reserved:reserving"].get_width() == pytest.approx(60)
    assert bars["internal:reserving"].get_x() == pytest.approx(80)
    assert bars["tokens:paged"].get_width() == pytest.approx(90)
    assert bars["internal:paged"].get_width() == 0
    assert bars["tokens:paged"].get_y() > bars["tokens:reserving"].get_y()  # one row each, in order
    totals = {t.get_gid(): t.get_text() for t in ax.texts if t.get_gid()}
    assert totals == {"total:reserving": "100 token-steps", "total:paged": "100 token-steps"}
    assert "60%" in [t.get_text() for t in ax.texts]
