"""The widgets, tested as state: set a control, check what the trace and the drawn figure became.
No browser; figures are drawn with matplotlib's Agg backend."""

import base64

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from minillm import workloads  # noqa: E402
from minillm.metrics import RequestMetrics, percentiles  # noqa: E402
from minillm.request import RequestOutput  # noqa: E402
from minillm.trace import StepRecord, Trace  # noqa: E402
from minillm.widgets import palette  # noqa: E402
from minillm.widgets.controls import SimulationControls, llm_run, simulated_run  # noqa: E402
from minillm.widgets.latency import LatencyTimeline, draw_latency  # noqa: E402
from minillm.widgets.slots import SlotsTimeline, assign_slots, cell_grid, draw_slots, slots_per_step  # noqa: E402

MS = 1e-3


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def step(i, prefill=(), decode=(), slots=None, finished=(), waiting=0):
    """Step ``i`` runs from i*10 ms to (i+1)*10 ms; prefill computes 4 tokens, decode 1."""
    return StepRecord(
        step=i,
        start_time=10 * i * MS,
        end_time=10 * (i + 1) * MS,
        num_scheduled_tokens={**{r: 4 for r in prefill}, **{r: 1 for r in decode}},
        prefill_ids=list(prefill),
        decode_ids=list(decode),
        finished_ids=list(finished),
        num_running=len(slots or {}),
        num_waiting=waiting,
        slots=dict(slots or {}),
    )


def output(rid, arrival, first_step, token_steps):
    """A request that arrived at ``arrival`` s, was first scheduled at ``first_step`` and got a token
    at the end of each of ``token_steps``."""
    times = [10 * (s + 1) * MS for s in token_steps]
    m = RequestMetrics(
        arrival_time=arrival,
        first_scheduled_time=10 * first_step * MS,
        first_token_time=times[0],
        token_times=times,
        finished_time=times[-1],
        first_token_step=token_steps[0],
        finished_step=token_steps[-1],
    )
    return RequestOutput(rid, [1, 2, 3, 4], [7] * len(times), "", "length", m)


def static_batch_example():
    """Two slots, static batching: A (2 tokens) and B (4 tokens) form a batch; C arrives with them
    and waits until the whole batch is done; A's slot idles (padding) meanwhile."""
    batch = {"A": 0, "B": 1}
    trace = Trace()
    for record in [
        step(0, prefill="AB", slots=batch, waiting=1),
        step(1, decode="AB", slots=batch, finished="A", waiting=1),
        step(2, decode="B", slots=batch, waiting=1),
        step(3, decode="B", slots=batch, finished="B", waiting=1),
        step(4, prefill="C", slots={"C": 0}),
        step(5, decode="C", slots={"C": 0}, finished="C"),
    ]:
        trace.record(record)
    outputs = [output("A", 0.0, 0, [0, 1]), output("B", 0.0, 0, [0, 1, 2, 3]), output("C", 0.0, 4, [4, 5])]
    return trace, outputs


def cell_counts(ax) -> dict:
    """How many cells of the drawn slots image have each state's colour."""
    image = np.asarray(ax.images[0].get_array())
    return {s: int(np.all(np.isclose(image, to_rgb(palette.COLORS[s])), axis=-1).sum()) for s in palette.STATES}


# --- slot assignment --------------------------------------------------------------------------


def test_assign_slots_keeps_a_request_on_its_lowest_free_slot():
    trace = Trace()
    for record in [
        step(0, prefill="AB"),
        step(1, decode="B"),
        step(2, decode="AB"),  # A idles in step 1
        step(3, prefill="C", decode="B"),
        step(4, decode="CB"),
        step(5, prefill="D"),
    ]:
        trace.record(record)
    assert assign_slots(trace) == [
        {"A": 0, "B": 1},
        {"A": 0, "B": 1},
        {"A": 0, "B": 1},
        {"B": 1, "C": 0},  # A left after step 2: C takes the lowest free slot
        {"B": 1, "C": 0},
        {"D": 0},
    ]
    assert slots_per_step(trace) == assign_slots(trace)  # nothing recorded: computed


def test_recorded_slots_win_over_computed_ones():
    trace, _ = static_batch_example()
    trace.steps[0].slots = {"A": 1, "B": 0}
    assert slots_per_step(trace)[0] == {"A": 1, "B": 0}


# --- slots timeline ---------------------------------------------------------------------------


def test_cells_of_a_static_batch_are_coloured_by_state():
    trace, outputs = static_batch_example()
    ax = draw_slots(trace, outputs)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["slot 0", "slot 1", "queue 1"]
    assert cell_counts(ax) == {"prefill": 3, "decode": 5, "idle": 2, "waiting": 4, "empty": 4}
    grid = cell_grid(trace, outputs)
    assert grid.labels[0] == ["A", "A", "A", "A", "C", "C"]  # A keeps its slot, idle, until the batch ends
    assert grid.labels[2] == ["C", "C", "C", "C", "", ""]  # C queues meanwhile


def test_request_rows_show_each_request_s_life():
    trace, outputs = static_batch_example()
    ax = draw_slots(trace, outputs, rows="requests")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["A", "B", "C"]
    assert cell_counts(ax) == {"prefill": 3, "decode": 5, "idle": 2, "waiting": 4, "empty": 4}
    codes = cell_grid(trace, outputs, rows="requests").states
    assert [palette.STATES[c] for c in codes[2]] == ["waiting"] * 4 + ["prefill", "decode"]


def test_step_slider_moves_the_outline_and_describes_the_step():
    trace, outputs = static_batch_example()
    w = SlotsTimeline(trace, outputs)
    first_png = w.image.value
    w.slider.value = 2
    marker = [p for p in w.ax.patches if p.get_gid() == "current-step"]
    assert len(marker) == 1 and marker[0].get_x() == pytest.approx(1.5)
    assert "step 2" in w.info.value and "idle     A" in w.info.value and "decode   B" in w.info.value
    assert w.image.value != first_png
    w.play.value = 4  # the play button drives the slider
    assert w.slider.value == 4 and marker[0].get_x() == pytest.approx(3.5)
    assert "prefill  C (4 tokens)" in w.info.value


def test_a_queue_longer_than_its_rows_says_how_many_more_wait():
    w = workloads.mix_workload("uniform", 9, seed=0)  # all at t=0: 8 wait behind one slot
    from minillm.sim import simulate

    run = simulate("continuous", w, max_num_seqs=1)
    grid = cell_grid(run.trace, run.outputs, max_queue_rows=3)
    assert grid.row_names[-4:] == ["queue 1", "queue 2", "queue 3", "more waiting"]
    waiting = [r.num_waiting for r in run.trace]
    assert grid.labels[-1][0] == f"+{waiting[0] - 3}" == "+5"
    assert all(label == (f"+{n - 3}" if n > 3 else "") for label, n in zip(grid.labels[-1], waiting))
    few = cell_grid(run.trace, run.outputs, max_queue_rows=8)  # every waiting request has its row
    assert "more waiting" not in few.row_names


def test_the_step_cursor_sits_under_the_request_names():
    trace, outputs = static_batch_example()
    ax = draw_slots(trace, outputs, step=1)
    cursor = next(p for p in ax.patches if p.get_gid() == "current-step")
    names = [t for t in ax.texts if t.get_text() in ("A", "B", "C")]
    assert names and all(t.get_zorder() > cursor.get_zorder() for t in names) and cursor.get_alpha() <= 0.3


def test_widgets_carry_a_png_for_viewers_without_widgets():
    trace, outputs = static_batch_example()
    for view in (SlotsTimeline(trace, outputs), LatencyTimeline(outputs)):
        bundle = view._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")


# --- latency timeline -------------------------------------------------------------------------


def test_latency_timeline_has_a_bar_group_per_request_and_marks_p50_p95():
    trace, outputs = static_batch_example()
    fig = draw_latency(outputs)
    timeline, ttft, itl, e2e = fig.axes
    groups = [c for c in timeline.collections if (c.get_gid() or "").startswith("request-")]
    assert [g.get_gid() for g in groups] == ["request-A", "request-B", "request-C"]
    assert len(groups[2].get_paths()) == 3  # C: queue, prefill, decode
    expected = {
        ttft: [o.metrics.ttft for o in outputs],
        itl: [gap for o in outputs for gap in o.metrics.itl],
        e2e: [o.metrics.e2e for o in outputs],
    }
    for ax, values in expected.items():
        p = percentiles(values, ps=(50, 95))
        lines = {line.get_gid(): line.get_xdata()[0] for line in ax.lines}
        assert lines["p50"] == pytest.approx(p["p50"] / MS)  # drawn in ms
        assert lines["p95"] == pytest.approx(p["p95"] / MS)


def test_a_histogram_legend_never_covers_a_bar():
    from minillm.widgets.latency import draw_histogram

    fig, ax = plt.subplots()
    draw_histogram("ITL", np.linspace(0.01, 0.02, 200).tolist(), ax)  # bars of one height, wall to wall
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    bars = [p.get_window_extent() for p in ax.patches if p.get_height() > 0]
    assert bars and not any(legend.overlaps(bar) for bar in bars)
    plt.close(fig)


# --- controls ---------------------------------------------------------------------------------


def test_controls_rerun_real_runs_and_redraw():
    c = SimulationControls(llm_run("tiny", num_requests=3, seed=0), engine="continuous", max_num_seqs=4, rate=1000.0)
    steps, rows = len(c.trace), c.slots.grid.row_names
    png = c.slots.image.value
    assert len(c.outputs) == 3 and "output tok/s" in c.summary.value and "TTFT" in c.summary.value
    c.max_num_seqs.value = 1
    assert len(c.trace) == sum(len(o.token_ids) for o in c.outputs) > steps  # one slot: the requests take turns
    assert c.slots.grid.num_slot_rows == 1 and c.slots.grid.row_names != rows
    assert c.slots.slider.max == len(c.trace) - 1 and c.slots.image.value != png


def test_controls_show_a_failed_run_and_keep_the_last_one():
    def run(engine, max_num_seqs, rate, mix):
        if engine == "chunked":
            raise NotImplementedError("engine 'chunked' is built in chapter 6")
        trace, outputs = static_batch_example()
        return outputs, trace

    c = SimulationControls(run, engine="static", engines=["static", "chunked"])
    trace = c.trace
    c.engine.value = "chunked"
    assert "chapter 6" in c.status.value and c.trace is trace


def test_default_controls_simulate_every_change():
    c = SimulationControls(simulated_run(num_requests=12), engine="continuous", max_num_seqs=2)
    steps, latency_png = len(c.trace), c.latency.image.value
    c.max_num_seqs.value = 8
    assert len(c.trace) < steps and c.slots.grid.num_slot_rows > 2
    assert c.latency.image.value != latency_png
    outputs = c.outputs
    c.mix.value = "uniform"
    assert [len(o.token_ids) for o in c.outputs] != [len(o.token_ids) for o in outputs]
    c.engine.value = "static"
    idle = palette.STATES.index(palette.IDLE)
    assert (c.slots.grid.states == idle).any()  # a static batch pads finished requests' slots
    c.engine.value = "naive"
    assert c.max_num_seqs.disabled and c.slots.grid.num_slot_rows == 1
    assert base64.b64decode(c._repr_mimebundle_()["image/png"]).startswith(b"\x89PNG")


def test_a_budget_slider_for_the_chunked_engine_reruns_the_simulation():
    c = SimulationControls(simulated_run(num_requests=12), engine="continuous", max_num_seqs=4, rate=50.0)
    budget = c.max_num_batched_tokens
    assert budget.disabled and budget.layout.display == "none"  # the continuous engine has no budget
    assert budget.options[0] == 16 and budget.options[-1] == 8192 and budget.value == 512
    c.engine.value = "chunked"
    assert not budget.disabled and budget.layout.display is None
    assert max(s.num_batched_tokens for s in c.trace) > 16  # long summaries' prompts run whole at 512
    steps, latency_png = len(c.trace), c.latency.image.value
    budget.value = 16
    assert max(s.num_batched_tokens for s in c.trace) <= 16 and len(c.trace) > steps  # prompts spread over more steps
    assert c.latency.image.value != latency_png
    budget.value = 8192
    assert len(c.trace) <= steps
    c.engine.value = "paged"
    assert budget.disabled and budget.layout.display == "none"


def test_the_controls_say_what_runs_and_when_a_budget_cuts_nothing():
    c = SimulationControls(simulated_run(num_requests=12), engine="chunked", max_num_seqs=4, rate=50.0)
    assert "simulated: h200-qwen3-0.6b" in c.header.value and "not a measurement" in c.header.value
    assert "max ms" in c.summary.value  # the longest gap: the stall a budget removes
    longest = max(len(o.prompt_token_ids) for o in c.outputs)
    c.max_num_batched_tokens.value = 8192
    assert f"longest prompt ({longest} tokens) whole" in c.status.value and "paged" in c.status.value
    c.max_num_batched_tokens.value = 16
    assert c.status.value == ""
    real = SimulationControls(llm_run("tiny", num_requests=2, seed=0), engine="continuous", rate=1000.0)
    assert "measured: real runs of tiny on this machine" in real.header.value


def test_the_budget_reaches_only_run_functions_that_take_it():
    calls = []

    def old_run(engine, max_num_seqs, rate, mix):  # a four-value run function, as before chapter 6
        calls.append(engine)
        trace, outputs = static_batch_example()
        return outputs, trace

    c = SimulationControls(old_run, engine="chunked", engines=["static", "chunked"])
    assert calls == ["chunked"] and c.max_num_batched_tokens.disabled  # it could not pass the budget on

    def new_run(engine, max_num_seqs, rate, mix, max_num_batched_tokens=None):
        calls.append(max_num_batched_tokens)
        return old_run(engine, max_num_seqs, rate, mix)

    c = SimulationControls(new_run, engine="chunked", engines=["static", "chunked"], max_num_batched_tokens=64)
    c.max_num_batched_tokens.value = 128
    c.engine.value = "static"
    assert calls[-6:] == [64, "chunked", 128, "chunked", None, "static"]  # the static engine takes no budget


def test_named_mixes_are_seeded_and_keep_kinds_together():
    mix = "support chat: short answers + long summaries"
    a, b = workloads.mix_workload(mix, 200, rate=5.0, seed=2), workloads.mix_workload(mix, 200, rate=5.0, seed=2)
    assert a.prompts == b.prompts and a.arrival_times == b.arrival_times
    long_prompt = [len(p) >= 200 for p in a.prompts]
    long_output = [s.max_tokens >= 64 for s in a.sampling_params]
    assert long_prompt == long_output and 0.1 < np.mean(long_prompt) < 0.3  # summaries: long in, long out
    with pytest.raises(ValueError, match="unknown mix"):
        workloads.mix_workload("nope", 3)
