"""The KV block map with prefix caching, tested as state: a simulated paged run whose requests share
a prompt prefix, checked step by step against the block manager itself (reference counts, cached
free blocks), then what the figure holds (cell colours, hatching, legend counts, the shared blocks
in a block table), and that a run without caching draws and records as before."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from minillm import LLM, SamplingParams  # noqa: E402
from minillm.request import Request  # noqa: E402
from minillm.sim.cost_model import Profile  # noqa: E402
from minillm.sim.simulate import DEFAULT_PROFILE, build_sim_engine  # noqa: E402
from minillm.widgets import block_map, draw_block_map, draw_block_tables  # noqa: E402
from minillm.widgets.block_map import (  # noqa: E402
    CACHED_FREE,
    FREE,
    block_map_state,
    request_colors,
    shared_color,
)

BLOCK = 4
PREFIX = list(range(1, 13))  # three full blocks every prompt starts with


def workload():
    """Request 0 runs alone and finishes, leaving the prefix's blocks cached and free; a second later
    requests 1-4 arrive together, each finds those blocks (four holders), and they finish one by one
    (three holders, then two, one, none)."""
    requests = [Request("0", PREFIX + [100, 101], SamplingParams(max_tokens=2, ignore_eos=True), 0.0)]
    for i in range(1, 5):
        params = SamplingParams(max_tokens=2 + i, ignore_eos=True)
        requests.append(Request(str(i), PREFIX + [100 + 10 * i, 101 + 10 * i], params, 1.0))
    return requests


def run_step_by_step(engine="paged", enable_prefix_caching=True):
    """The workload in the simulator, one step at a time; after each step, what the block manager
    says: every block's reference count, and the free blocks whose hash is still cached (read from
    the free queue, not the way the engine records them)."""
    options = dict(max_num_seqs=4, block_size=BLOCK, num_gpu_blocks=16, enable_prefix_caching=enable_prefix_caching)
    sim = build_sim_engine(engine, Profile.load(DEFAULT_PROFILE), fast_forward=False, **options)
    for request in workload():
        sim.add_request(request)
    bm = sim.scheduler.block_manager
    ref_counts, cached_free = [], []
    while sim.has_unfinished_requests():
        sim.step(stream=False)
        if len(ref_counts) < len(sim.trace):  # a step ran (not a wait for the next arrival)
            ref_counts.append(list(bm.ref_counts))
            if enable_prefix_caching:
                cached_free.append(sorted(b for b in bm.free_block_ids if bm.block_hashes[b] is not None))
    return sim.trace, ref_counts, cached_free


@pytest.fixture(scope="module")
def cached_run():
    return run_step_by_step()


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def step_where(trace, admitted):
    return next(r.step for r in trace if admitted in r.admitted_ids)


def grid_cell(ax, block, cols=16):
    image = next(im for im in ax.images if im.get_gid() == "block-grid").get_array()
    return tuple(image[block // cols, block % cols][:3])


@pytest.mark.parametrize("engine", ["paged", "chunked"])
def test_holder_counts_and_cached_free_blocks_agree_with_the_block_manager_at_every_step(engine):
    trace, ref_counts, cached_free = run_step_by_step(engine)
    for step in range(len(trace)):
        state = block_map_state(trace, step)
        assert state.num_holders == ref_counts[step], step
        assert state.cached_free == cached_free[step], step
        assert state.allocated_tokens == state.num_used_blocks * BLOCK  # a shared block counted once
        assert state.prefix_caching
    counts = {c for state_counts in ref_counts for c in state_counts}
    assert {2, 3, 4} <= counts  # every colour of the legend shows up in the run
    assert any(cached and any(counts) for cached, counts in zip(cached_free, ref_counts))  # held and cached at once


def test_the_shared_prefix_is_held_by_every_request_then_cached_when_they_finish(cached_run):
    trace, _, _ = cached_run
    prefix_blocks = block_map_state(trace, 0).tables["0"][:3]  # request 0 computed the prefix first
    alone = step_where(trace, "1") - 1  # request 0 has finished, the others have not arrived
    assert block_map_state(trace, alone).cached_free[:3] == sorted(prefix_blocks)
    together = block_map_state(trace, step_where(trace, "1"))
    assert [together.num_holders[b] for b in prefix_blocks] == [4, 4, 4]
    assert all(together.tables[rid][:3] == prefix_blocks for rid in "1234")
    # Sharing stores the prefix once: the gauge counts each shared block once, as the pool does.
    assert together.saved_tokens == 3 * 3 * BLOCK
    assert together.allocated_tokens == together.num_used_blocks * BLOCK
    last = block_map_state(trace, len(trace) - 1)
    assert last.num_used_blocks == 0 and set(prefix_blocks) <= set(last.cached_free)


def test_rows_record_the_cached_free_blocks_only_when_they_change(cached_run):
    trace, _, cached_free = cached_run
    recorded = [r.cached_free_blocks for r in trace]
    assert recorded[0] == []  # a trace's first row always says, so nothing is carried in from before
    assert None in recorded
    changes = [i for i in range(1, len(trace)) if cached_free[i] != cached_free[i - 1]]
    assert [i for i, blocks in enumerate(recorded) if blocks is not None] == [0, *changes]


def test_shared_and_cached_free_blocks_are_drawn_apart(cached_run):
    trace, ref_counts, cached_free = cached_run
    step = next(i for i, counts in enumerate(ref_counts) if 3 in counts)  # request 1 has finished
    state = block_map_state(trace, step)
    assert 3 in state.num_holders and state.cached_free
    ax = draw_block_map(trace, step, selected="2")
    colors = request_colors(trace)
    for b, count in enumerate(ref_counts[step]):
        if count > 1:
            expected = shared_color(count)
        elif count == 1:
            expected = colors[state.owners[b]]
        else:
            expected = CACHED_FREE if b in cached_free[step] else FREE
        assert grid_cell(ax, b) == pytest.approx(to_rgb(expected)), b
    assert shared_color(2) != shared_color(3) != shared_color(4) == shared_color(7)
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("×3") == ref_counts[step].count(3)
    hatched = next(c for c in ax.collections if c.get_gid() == "cached-free")
    assert len(hatched.get_paths()) == len(cached_free[step])
    assert ax.get_legend().get_gid() == "block-legend"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"shared by 3: {ref_counts[step].count(3)}" in legend
    assert f"free, prefix still cached: {len(cached_free[step])}" in legend
    assert f"free: {ref_counts[step].count(0) - len(cached_free[step])}" in legend
    # The block table still says who holds its shared blocks, and draws them in the shared colour.
    sharers = next(t for t in ax.texts if t.get_gid() == "table-sharers").get_text()
    assert sharers == "shares blocks with 3, 4"
    cells = [p.get_facecolor()[:3] for p in ax.patches if p.get_gid() == "table-cell"]
    assert cells[:3] == [pytest.approx(to_rgb(shared_color(3)))] * 3
    assert cells[3] == pytest.approx(to_rgb(colors["2"]))
    gauge = {p.get_gid(): p.get_width() for p in ax.patches if (p.get_gid() or "").startswith("gauge")}
    assert gauge["gauge-cached"] / gauge["gauge-pool"] == pytest.approx(len(cached_free[step]) / 16)
    assert "sharing saves" in next(t for t in ax.texts if t.get_gid() == "gauge-text").get_text()


def test_without_caching_nothing_is_recorded_or_drawn_for_it(cached_run):
    trace_on = cached_run[0]
    trace_off, ref_counts, _ = run_step_by_step(enable_prefix_caching=False)
    assert all(r.cached_free_blocks is None for r in trace_off)
    assert max(max(counts) for counts in ref_counts) == 1  # no block shared
    step = step_where(trace_off, "1")
    state = block_map_state(trace_off, step)
    assert not state.prefix_caching and state.cached_free == [] and state.saved_tokens == 0
    off = draw_block_map(trace_off, step)
    assert off.get_legend() is None
    assert not any(c.get_gid() == "cached-free" for c in off.collections)
    assert not any(p.get_gid() == "gauge-cached" for p in off.patches)
    on = draw_block_map(trace_on, step_where(trace_on, "1"))
    image = [next(im for im in ax.images if im.get_gid() == "block-grid").get_array() for ax in (off, on)]
    assert (image[0] != image[1]).any()
    assert off.figure.get_size_inches()[1] < on.figure.get_size_inches()[1]  # the legend's row


def test_the_widget_shows_the_cache_as_the_slider_moves(cached_run):
    trace = cached_run[0]
    view = block_map(trace, selected="2")
    view.slider.value = step_where(trace, "1") - 1
    before = view.static_png()
    assert view.state.cached_free and view.state.num_used_blocks == 0
    view.slider.value = step_where(trace, "1")
    assert 4 in view.state.num_holders and view.static_png() != before
    assert view.ax.get_legend() is not None


def test_a_later_call_starts_with_the_blocks_an_earlier_call_left_cached():
    """A real engine: the second ``generate``'s first row records what the first call left cached,
    although nothing changed between the two calls."""
    llm = LLM("tiny", engine="paged", block_size=4, num_gpu_blocks=32, enable_prefix_caching=True)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    llm.generate([PREFIX + [100]], params)
    first_table = block_map_state(llm.trace, 0).tables["0"]
    llm.generate([[200, 201, 202]], params)  # no shared prefix: it takes a never-used block
    state = block_map_state(llm.trace, 0)
    assert state.cached_free == sorted(first_table[:3])  # the prefix's full blocks, findable again
    assert llm.generate([PREFIX + [7]], params)[0].num_cached_tokens == 12


def test_block_tables_draw_shared_and_cached_physical_blocks():
    ax = draw_block_tables({"A": [0, 1, 2], "B": [0, 1, 3]}, num_blocks=6, block_size=BLOCK, cached_free=[4])
    fill = {p.get_gid(): p.get_facecolor()[:3] for p in ax.patches}
    assert fill["physical:0"] == fill["physical:1"] == pytest.approx(to_rgb(shared_color(2)))
    assert fill["physical:4"] == pytest.approx(to_rgb(CACHED_FREE)) and fill["physical:5"] == (1.0, 1.0, 1.0)
    assert next(p for p in ax.patches if p.get_gid() == "physical:4").get_hatch()
    texts = [t.get_text() for t in ax.texts]
    assert "0\nshared" in texts and "4\ncached" in texts and "2\nA" in texts
    arrows = {t.get_gid(): t.xy for t in ax.texts if (t.get_gid() or "").startswith("arrow:")}
    assert arrows["arrow:A:0"][0] == arrows["arrow:B:0"][0] == 0.5  # both requests point at block 0
    assert ax.get_title(loc="left") == "block tables: 4 of 6 physical blocks held (2 shared), 2 free (1 still cached)"
