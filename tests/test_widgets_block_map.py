"""The KV block map, tested as state: a small hand-made paged run, then what the map's data and
the figure hold (cell colours, gauge widths, marks), not pixels."""

import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from minillm.trace import StepRecord, Trace  # noqa: E402
from minillm.widgets import block_map, block_tables_at, draw_block_map  # noqa: E402
from minillm.widgets.block_map import BlockMap, block_map_state, grid_columns, request_colors  # noqa: E402

BLOCK = 4


class Record(StepRecord):
    """No __slots__: takes the paged fields as attributes whether or not StepRecord declares them yet."""


def step(i, tables, preempted=(), swapped=(), kv_tokens=0):
    record = Record(
        step=i,
        start_time=i * 0.01,
        end_time=(i + 1) * 0.01,
        num_scheduled_tokens={"A": 1},
        prefill_ids=[],
        decode_ids=["A"],
        preempted_ids=list(preempted),
        kv_tokens=kv_tokens,
        kv_allocated_tokens=BLOCK * sum(map(len, (tables or {}).values())),
    )
    record.block_tables = tables
    record.swapped_out_ids = list(swapped)
    return record


def paged_trace(num_blocks=16):
    """A and B grow, step 2 changes nothing (None), B is preempted at step 3, C swapped out at 4."""
    trace = Trace()
    rows = [
        step(0, {"A": [0, 1], "B": [2]}, kv_tokens=10),
        step(1, {"A": [0, 1, 3], "B": [2, 4], "C": [5]}, kv_tokens=20),
        step(2, None, kv_tokens=22),
        step(3, {"A": [0, 1, 3, 2], "C": [5]}, preempted=["B"], kv_tokens=17),
        step(4, {"A": [0, 1, 3, 2]}, swapped=["C"], kv_tokens=15),
    ]
    rows[2].kv_allocated_tokens = rows[1].kv_allocated_tokens  # unchanged tables, unchanged allocation
    for r in rows:
        trace.record(r)
    trace.num_gpu_blocks, trace.block_size = num_blocks, BLOCK
    return trace


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def grid_image(ax):
    return next(im for im in ax.images if im.get_gid() == "block-grid").get_array()


def cell(ax, block, cols=16):
    return tuple(grid_image(ax)[block // cols, block % cols][:3])


def patch(ax, gid):
    return next(p for p in ax.patches if p.get_gid() == gid)


def test_tables_carry_forward_over_unchanged_steps():
    trace = paged_trace()
    assert block_tables_at(trace, 2) == {"A": [0, 1, 3], "B": [2, 4], "C": [5]}
    assert block_tables_at(trace, 3) == {"A": [0, 1, 3, 2], "C": [5]}
    before = Trace()
    before.record(step(0, None))
    assert block_tables_at(before, 0) == {}


def test_colours_per_request_stable_and_free_cells_blank():
    trace = paged_trace()
    colors = request_colors(trace)
    assert len(set(colors.values())) == 3
    ax1 = draw_block_map(trace, 1)
    ax3 = draw_block_map(trace, 3)
    for ax in (ax1, ax3):
        assert cell(ax, 0) == pytest.approx(to_rgb(colors["A"]))
        assert cell(ax, 5) == pytest.approx(to_rgb(colors["C"]))
    assert cell(ax1, 2) == pytest.approx(to_rgb(colors["B"]))
    assert cell(ax3, 2) == pytest.approx(to_rgb(colors["A"]))  # B's freed block went to A
    assert cell(ax3, 4) == (1.0, 1.0, 1.0)  # freed by B's preemption: blank
    state = block_map_state(trace, 3)
    assert [b for b, owner in enumerate(state.owners) if owner is None] == [4, *range(6, 16)]
    assert all(cell(ax3, b) == (1.0, 1.0, 1.0) for b in range(6, 16))


def test_gauge_numbers():
    trace = paged_trace()
    state = block_map_state(trace, 1)
    assert (state.used_tokens, state.allocated_tokens, state.capacity_tokens) == (20, 24, 64)
    ax = draw_block_map(trace, 1)
    pool = patch(ax, "gauge-pool").get_width()
    assert patch(ax, "gauge-allocated").get_width() / pool == pytest.approx(24 / 64)
    assert patch(ax, "gauge-used").get_width() / pool == pytest.approx(20 / 64)
    text = next(t for t in ax.texts if t.get_gid() == "gauge-text").get_text()
    assert "used 20" in text and "allocated 24" in text and "pool 64 tokens (16 blocks x 4)" in text


def test_preemption_and_swap_marked():
    trace = paged_trace()
    ax = draw_block_map(trace, 3, labels={"B": "bob"})
    events = next(t for t in ax.texts if t.get_gid() == "events").get_text()
    assert "preempted bob" in events
    assert [line.get_gid() for line in ax.lines] == ["freed-preempted"]  # block 4; block 2 was reused by A
    ax = draw_block_map(trace, 4)
    assert "swapped out C" in next(t for t in ax.texts if t.get_gid() == "events").get_text()
    assert block_map_state(trace, 4).freed_by_event == {5: "swapped out"}
    assert not any(t.get_gid() == "events" for t in draw_block_map(trace, 1).texts)


def test_requests_in_the_pool_together_never_share_a_colour():
    # Request 0 holds blocks all run long while 29 others come and go two at a time: the 21st request
    # to arrive must not take request 0's colour, although 20 colours have gone round.
    trace = Trace()
    for i in range(30):
        trace.record(step(i, {"0": [0], **{str(r): [r % 15 + 1] for r in range(max(1, i - 1), min(i + 1, 30))}}))
    colors = request_colors(trace)
    assert len(colors) == 30
    for record in trace:
        holders = [rid for rid, blocks in record.block_tables.items() if blocks]
        assert len({colors[rid] for rid in holders}) == len(holders), holders


def test_cells_past_the_pool_are_not_drawn_as_blocks():
    trace = Trace()
    trace.record(step(0, {"A": [0, 19]}))
    trace.num_gpu_blocks, trace.block_size = 20, BLOCK
    ax = draw_block_map(trace, 0)
    borders = [c for c in ax.collections if c.get_gid() == "cell-borders"]
    segments = [seg for c in borders for seg in c.get_segments()]
    # 16 columns: one full row, then 4 cells; no border reaches past block 19 (row 1, column 3)
    assert max(x for seg in segments for x, y in seg if y > 1) == 4
    assert cell(ax, 19) == pytest.approx(to_rgb(request_colors(trace)["A"]))


def test_selected_request_draws_its_table():
    trace = paged_trace()
    ax = draw_block_map(trace, 3, selected="A")
    cells = [p for p in ax.patches if p.get_gid() == "table-cell"]
    assert len(cells) == 4
    assert all(p.get_facecolor()[:3] == pytest.approx(to_rgb(request_colors(trace)["A"])) for p in cells)
    texts = [t.get_text() for t in ax.texts]
    assert "block table of A: logical -> physical" in texts
    outlined = sorted((int(p.get_x()), int(p.get_y())) for p in ax.patches if p.get_gid() == "selected-block")
    assert outlined == [(0, 0), (1, 0), (2, 0), (3, 0)]
    empty = draw_block_map(trace, 3)
    assert not any(p.get_gid() == "table-cell" for p in empty.patches)
    assert any(t.get_gid() == "table-empty" for t in empty.texts)


def test_slider_and_dropdown_change_the_picture():
    trace = paged_trace()
    view = block_map(trace)
    assert isinstance(view, BlockMap)
    assert view.slider.max == 4 and view.request.value == "A"
    first = view.static_png()
    view.slider.value = 3
    assert view.state.step == 3 and view.static_png() != first
    at_a = view.static_png()
    view.request.value = "C"
    assert view.static_png() != at_a
    assert sum(p.get_gid() == "table-cell" for p in view.ax.patches) == 1
    assert "3 (preempt)" in view.info.value and "4 (swap)" in view.info.value
    assert "image/png" in view._repr_mimebundle_()


def test_the_picture_keeps_its_height_as_the_slider_and_dropdown_move():
    """A picture that changes height makes the page jump under the learner's cursor."""
    view = block_map(paged_trace())
    heights = set()
    for request in ("A", "C", None):
        view.request.value = request
        for i in range(view.slider.max + 1):
            view.slider.value = i
            heights.add(plt.imread(io.BytesIO(view.static_png())).shape[0])
    assert len(heights) == 1, heights


def test_a_wrapped_tables_second_row_of_indices_clears_the_first_row_of_cells():
    trace = Trace()
    trace.record(step(0, {"A": list(range(10))}))  # 10 blocks: a table of two rows
    trace.num_gpu_blocks, trace.block_size = 512, BLOCK  # a large pool: small cells, the type as large
    ax = draw_block_map(trace, 0, selected="A")
    renderer = ax.figure.canvas.get_renderer()
    first_row = [p for p in ax.patches if p.get_gid() == "table-cell" and p.get_y() < 1.5]
    cells_bottom = max(p.get_window_extent(renderer).y1 - p.get_window_extent(renderer).height for p in first_row)
    index_8 = next(t for t in ax.texts if t.get_text() == "8" and t.get_color() == "#555555")
    assert index_8.get_window_extent(renderer).y1 < cells_bottom  # below the first row's cells, not under them


@pytest.mark.parametrize("num_blocks", [16, 100, 512])
def test_large_pools_wrap_into_rows(num_blocks):
    trace = Trace()
    trace.record(step(0, {str(i): list(range(i * 8, i * 8 + 8)) for i in range(num_blocks // 8)}))
    trace.num_gpu_blocks, trace.block_size = num_blocks, 16
    cols = grid_columns(num_blocks)
    ax = draw_block_map(trace, 0, selected="1")
    assert grid_image(ax).shape[:2] == (int(np.ceil(num_blocks / cols)), cols)
    assert grid_image(ax).shape[0] <= 16


def test_pool_inferred_when_trace_does_not_say():
    trace = paged_trace()
    del trace.num_gpu_blocks, trace.block_size
    state = block_map_state(trace, 1)
    assert (state.num_blocks, state.block_size, state.capacity_tokens) == (6, 4, 24)


def test_block_tables_drawn_as_arrows_from_logical_to_physical_blocks():
    from minillm.kv.block_manager import BlockManager
    from minillm.widgets import draw_block_tables

    class Req:
        def __init__(self, request_id):
            self.request_id, self.num_computed_tokens, self.max_num_tokens = request_id, 0, 100

    bm = BlockManager(num_blocks=8, block_size=4)
    a, b, c = Req("A"), Req("B"), Req("C")
    bm.allocate_slots(a, 6)
    a.num_computed_tokens = 6
    bm.allocate_slots(b, 3)
    bm.allocate_slots(a, 3)  # A's third block comes after B's
    a.num_computed_tokens = 9
    bm.free(b)
    bm.allocate_slots(c, 5)
    c.num_computed_tokens = 5
    tables = {r.request_id: bm.get_block_table(r.request_id) for r in (a, c)}
    assert tables == {"A": [0, 1, 3], "C": [4, 5]}

    ax = draw_block_tables(tables, bm.num_blocks, bm.block_size, {"A": 9, "C": 5})
    arrows = {t.get_gid(): t for t in ax.texts if (t.get_gid() or "").startswith("arrow:")}
    assert sorted(arrows) == ["arrow:A:0", "arrow:A:1", "arrow:A:2", "arrow:C:0", "arrow:C:1"]
    # each arrow ends on the physical block its table names, starting at its logical block
    for rid, blocks in tables.items():
        for i, block in enumerate(blocks):
            arrow = arrows[f"arrow:{rid}:{i}"]
            assert arrow.xy[0] == block + 0.5 and arrow.xyann[0] == i + 0.5
    assert arrows["arrow:A:0"].xyann[1] < 0 < 1 < arrows["arrow:C:0"].xyann[1]  # A above the pool, C below
    # the pool: owners' colours, the rest (B's block 2, and 6, 7) free
    fill = {p.get_gid(): p.get_facecolor()[:3] for p in ax.patches}
    assert fill["physical:3"] == fill["logical:A:2"] != fill["physical:4"] == fill["logical:C:0"]
    assert fill["physical:2"] == fill["physical:7"] == (1.0, 1.0, 1.0)
    texts = [t.get_text() for t in ax.texts]
    assert "2\n1/4" in texts and "1\n1/4" in texts  # A's last block holds 1 token, C's too
    assert "2\nfree" in texts and "3\nA" in texts
    assert ax.get_title(loc="left").startswith("block tables: 5 of 8 physical blocks held, 3 free")


def test_block_tables_refuse_more_than_two_requests():
    from minillm.widgets import draw_block_tables

    with pytest.raises(ValueError, match="one or two requests"):
        draw_block_tables({"A": [0], "B": [1], "C": [2]}, num_blocks=4, block_size=4)
