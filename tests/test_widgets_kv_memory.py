"""``kv_memory_use`` and ``draw_kv_memory``: the waste figure chapter 5 quotes, from a trace."""

import matplotlib

matplotlib.use("Agg")

import pytest

from minillm import workloads
from minillm.trace import StepRecord, Trace
from minillm.widgets import draw_kv_memory, kv_memory_use


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
