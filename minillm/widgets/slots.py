"""Slots timeline: who holds which batch slot at every engine step, and who waits in the queue.

One column per engine step, one row per batch slot (a row of the batch the GPU computes), with the
queue's first few positions below the slots (and, when more wait, a row that says how many more).
A cell's colour says what that slot did in that step: prefill, decode, idle (held but computing
nothing useful: padding), or, in the queue rows, waiting.
Static batching shows up as grey idle cells and a long queue; iteration-level scheduling as slots
that are refilled the step after a request leaves.

    from minillm.widgets import slots_timeline
    slots_timeline(llm.trace, outputs)          # a step slider and a play button
    draw_slots(llm.trace, outputs, step=3)      # the same picture as a plain matplotlib Axes
    draw_slots(trace, outputs, labels={"0": "A", "1": "B", "2": "C"})   # names instead of request ids
    compare_slots({"static": (s_trace, s_out), "continuous": (c_trace, c_out)})  # runs one above the other
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from minillm.metrics import RequestMetrics
from minillm.widgets import palette
from minillm.widgets.figure_view import FigureView

# --- which request holds which slot -----------------------------------------------------------


def assign_slots(trace) -> list[dict[str, int]]:
    """A slot for every request at every step, for traces that do not record slots: a request
    takes the lowest free slot at its first scheduled step and keeps it until its last one, so it
    stays on one row. Returns one ``{request id: slot}`` per step."""
    first, last = {}, {}
    for i, record in enumerate(trace):
        for rid in record.num_scheduled_tokens:
            first.setdefault(rid, i)
            last[rid] = i
    held: dict[str, int] = {}
    per_step = []
    for i, record in enumerate(trace):
        for rid in record.num_scheduled_tokens:
            if first[rid] == i:
                taken = set(held.values())
                held[rid] = next(s for s in range(len(taken) + 1) if s not in taken)
        per_step.append(dict(held))
        for rid in [rid for rid in held if last[rid] == i]:
            del held[rid]
    return per_step


def slots_per_step(trace) -> list[dict[str, int]]:
    """The slots the engine recorded, or ``assign_slots`` when it recorded none."""
    if any(record.slots for record in trace):
        return [dict(record.slots) for record in trace]
    return assign_slots(trace)


# --- what every request does at every step ----------------------------------------------------


def states_per_step(trace, outputs, slots=None) -> list[dict[str, str]]:
    """For each step, ``{request id: state}`` for every request in the system, the waiting ones in
    arrival order. A request is in the system from its arrival until it finished, or for as long as
    it holds a slot (a static batch keeps a finished request's slot until the batch ends)."""
    slots = slots if slots is not None else slots_per_step(trace)
    by_arrival = sorted(outputs, key=lambda o: o.metrics.arrival_time)
    present: dict[str, RequestMetrics] = {}  # arrived and not finished, in arrival order
    next_arrival = 0
    result = []
    for record, held in zip(trace, slots):
        while next_arrival < len(by_arrival) and by_arrival[next_arrival].metrics.arrival_time <= record.start_time:
            o = by_arrival[next_arrival]
            present[o.request_id] = o.metrics
            next_arrival += 1
        for rid in [
            rid for rid, m in present.items() if m.finished_time is not None and m.finished_time <= record.start_time
        ]:
            del present[rid]
        states = {}
        for rid in [*held, *record.num_scheduled_tokens]:
            if rid in record.prefill_ids:
                states[rid] = palette.PREFILL
            elif rid in record.num_scheduled_tokens:
                states[rid] = palette.DECODE
            else:
                states[rid] = palette.IDLE
        for rid in present:
            states.setdefault(rid, palette.WAITING)
        result.append(states)
    return result


@dataclass
class CellGrid:
    """The timeline as data: ``states[row, step]`` is an index into ``palette.STATES``."""

    states: np.ndarray
    labels: list[list[str]]  # the request id in each cell, "" when none
    row_names: list[str]
    num_slot_rows: int  # rows below this one are queue positions


def cell_grid(trace, outputs, rows: str = "slots", max_queue_rows: int = 4, labels: dict | None = None) -> CellGrid:
    """``rows="slots"``: one row per batch slot, then the first ``max_queue_rows`` queue positions.
    ``rows="requests"``: one row per request, in prompt order. ``labels`` maps request ids to the
    names the cells show (``{"0": "A"}``); ids it does not name are shown as they are."""
    if rows not in ("slots", "requests"):
        raise ValueError(f"rows must be 'slots' or 'requests', got {rows!r}")
    grid = _cell_grid(trace, outputs, rows, max_queue_rows)
    if labels:

        def name(rid):
            return labels.get(rid, rid) if rid else rid

        grid.labels = [[name(rid) for rid in row] for row in grid.labels]
        if rows == "requests":
            grid.row_names = [name(rid) for rid in grid.row_names]
    return grid


def _cell_grid(trace, outputs, rows: str, max_queue_rows: int) -> CellGrid:
    slots = slots_per_step(trace)
    per_step = states_per_step(trace, outputs, slots)
    code = {s: i for i, s in enumerate(palette.STATES)}
    if rows == "requests":
        ids = [o.request_id for o in outputs]
        states = np.array([[code[step.get(rid, palette.EMPTY)] for step in per_step] for rid in ids], dtype=int)
        return CellGrid(states.reshape(len(ids), len(trace)), [[""] * len(trace) for _ in ids], ids, len(ids))

    num_slots = max((s + 1 for held in slots for s in held.values()), default=1)
    queues = [[rid for rid, s in step.items() if s == palette.WAITING] for step in per_step]
    num_queue = min(max_queue_rows, max((len(q) for q in queues), default=0))
    # When more wait than the queue rows show, one more row says how many more: "+3".
    cut = int(num_queue > 0 and any(len(q) > num_queue for q in queues))
    num_rows = num_slots + num_queue + cut
    states = np.full((num_rows, len(trace)), code[palette.EMPTY], dtype=int)
    labels = [[""] * len(trace) for _ in range(num_rows)]
    for i, (held, step, queue) in enumerate(zip(slots, per_step, queues)):
        for rid, slot in held.items():
            states[slot, i], labels[slot][i] = code[step[rid]], rid
        for pos, rid in enumerate(queue[:num_queue]):
            states[num_slots + pos, i], labels[num_slots + pos][i] = code[palette.WAITING], rid
        if cut and len(queue) > num_queue:
            labels[-1][i] = f"+{len(queue) - num_queue}"
    names = [f"slot {s}" for s in range(num_slots)] + [f"queue {q + 1}" for q in range(num_queue)]
    return CellGrid(states, labels, names + ["more waiting"] * cut, num_slots)


# --- drawing ----------------------------------------------------------------------------------


def draw_grid(grid: CellGrid, ax, step: int | None = None):
    """Draw a ``CellGrid``: cells as one image, request ids on runs of cells, the current step
    outlined."""
    rows, steps = grid.states.shape
    colors = np.array(palette.rgb_table())
    ax.imshow(colors[grid.states], aspect="auto", interpolation="nearest", extent=(-0.5, steps - 0.5, rows - 0.5, -0.5))
    if steps <= 120:  # thin white lines between cells, while cells are wide enough to see them
        ax.set_xticks(np.arange(-0.5, steps), minor=True)
        ax.set_yticks(np.arange(-0.5, rows), minor=True)
        ax.grid(which="minor", color="white", linewidth=0.8)
        ax.tick_params(which="minor", length=0)
    _mark_runs(grid, ax)
    if grid.num_slot_rows < rows:
        ax.axhline(grid.num_slot_rows - 0.5, color="black", linewidth=1.5)
    if step is not None and 0 <= step < steps:
        # A translucent column under the labels, not a frame across them: the names stay readable.
        ax.add_patch(
            Rectangle(
                (step - 0.5, -0.5),
                1,
                rows,
                facecolor=palette.HIGHLIGHT,
                edgecolor=palette.HIGHLIGHT,
                alpha=0.3,
                linewidth=1,
                gid="current-step",
                zorder=2,
            )
        )
    ax.set_yticks(range(rows), grid.row_names)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("engine step")
    ax.legend(
        handles=palette.legend_handles(), loc="lower left", bbox_to_anchor=(0, 1.01), ncol=4, frameon=False, fontsize=8
    )
    return ax


def _mark_runs(grid: CellGrid, ax) -> None:
    """Where a row passes from one request to the next, a white edge; at the start of each run of
    cells, the request id, if the run is wide enough to hold it."""
    rows, steps = grid.states.shape
    min_run = max(1, steps // 40)
    edges = []
    for r in range(rows):
        start = 0
        for i in range(1, steps + 1):
            if i < steps and grid.labels[r][i] == grid.labels[r][start]:
                continue
            if i < steps and grid.labels[r][i] and grid.labels[r][start]:
                edges.append((i - 0.5, r))
            if grid.labels[r][start] and i - start >= min_run:
                state = palette.STATES[grid.states[r, start]]
                ax.text(
                    start - 0.4,
                    r,
                    grid.labels[r][start],
                    ha="left",
                    va="center",
                    fontsize=9,
                    zorder=4,
                    color=palette.TEXT_ON[state],
                    clip_on=True,
                )
            start = i
    if edges:
        xs, ys = zip(*edges)
        ax.vlines(xs, [y - 0.5 for y in ys], [y + 0.5 for y in ys], colors="white", linewidth=1.5)


def draw_slots(
    trace,
    outputs,
    ax=None,
    step: int | None = None,
    rows: str = "slots",
    max_queue_rows: int = 4,
    labels: dict | None = None,
):
    """The slots timeline as a static matplotlib picture; returns the Axes (``ax.figure`` is the
    Figure). ``step`` outlines one column; ``labels`` names requests (``{"0": "A"}``)."""
    grid = cell_grid(trace, outputs, rows, max_queue_rows, labels)
    if ax is None:
        _, ax = plt.subplots(figsize=_figsize(grid))
    return draw_grid(grid, ax, step)


def compare_slots(runs: dict, labels: dict | None = None, max_queue_rows: int = 4):
    """Several runs of the same requests, one slots timeline each, one above the other on the same
    step axis. ``runs``: ``{title: (trace, outputs)}``. Returns the Figure; each Axes is titled with
    the run's name and its number of steps."""
    grids = {
        name: cell_grid(trace, outputs, "slots", max_queue_rows, labels) for name, (trace, outputs) in runs.items()
    }
    heights = [len(g.row_names) + 1.6 for g in grids.values()]
    fig, axes = plt.subplots(
        len(grids), 1, figsize=(8, 0.5 + 0.42 * sum(heights)), squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    longest = max((g.states.shape[1] for g in grids.values()), default=1)
    for ax, (name, grid) in zip(axes[:, 0], grids.items()):
        draw_grid(grid, ax)
        ax.set_xlim(-0.5, longest - 0.5)
        ax.set_title(f"{name}: {grid.states.shape[1]} steps", fontsize=10, pad=22)
    fig.tight_layout()
    return fig


def _figsize(grid: CellGrid) -> tuple[float, float]:
    return (10, min(12, 1.4 + 0.32 * len(grid.row_names)))


# --- one step in words ------------------------------------------------------------------------


def num_tokens_text(n: int) -> str:
    """``"1 token"``, ``"4 tokens"``."""
    return f"{n} token" if n == 1 else f"{n} tokens"


def prefill_spans(trace, outputs) -> list[dict[str, tuple[int, int, int]]]:
    """For each step, ``{request id: (first, last, of)}`` for every request that prefilled in it:
    its chunk covered tokens ``first..last`` (counted from 1) of the ``of`` tokens it had to compute
    before its next token could be sampled. That is its prompt, or, after a preemption that
    recomputes, its prompt and the tokens it had generated (a swapped-out request keeps its cache)."""
    prompt_len = {o.request_id: len(o.prompt_token_ids) for o in outputs}
    computed: dict[str, int] = {}  # tokens in the KV cache after the step
    known: dict[str, int] = {}  # prompt + generated tokens
    result = []
    for record in trace:
        for rid in record.preempted_ids:
            if rid not in record.swapped_out_ids:
                computed[rid] = 0
        spans = {}
        for rid, n in record.num_scheduled_tokens.items():
            if rid not in prompt_len:
                continue
            done, total = computed.get(rid, 0), known.setdefault(rid, prompt_len[rid])
            if rid in record.prefill_ids:
                spans[rid] = (done + 1, done + n, total)
            computed[rid] = done + n
            if done + n >= total:  # its last known token ran: the step sampled the next one
                known[rid] = done + n + 1
        result.append(spans)
    return result


def step_info(
    record,
    held: dict[str, int] | None = None,
    labels: dict | None = None,
    spans: dict[str, tuple[int, int, int]] | None = None,
) -> str:
    """What happened in one step: who ran (and how many tokens), who sat idle, queue lengths.
    ``labels`` names requests, as in ``draw_slots``. ``spans`` (this step's ``prefill_spans``) says
    which part of a prompt a chunk covered: "A (tokens 13–16 of 17)"; a whole prompt reads "A (17 tokens)"."""
    held = held if held is not None else record.slots
    name = (lambda rid: labels.get(rid, rid)) if labels else (lambda rid: rid)
    prefill = (
        ", ".join(
            f"{name(rid)} ({_chunk_text(record.num_scheduled_tokens[rid], (spans or {}).get(rid))})"
            for rid in record.prefill_ids
        )
        or "-"
    )
    decode = ", ".join(map(name, record.decode_ids)) or "-"
    idle = ", ".join(name(rid) for rid in held if rid not in record.num_scheduled_tokens) or "-"
    lines = [
        f"step {record.step}   {record.start_time * 1e3:.1f} -> {record.end_time * 1e3:.1f} ms "
        f"({record.duration * 1e3:.2f} ms)",
        f"prefill  {prefill}",
        f"decode   {decode}",
        f"idle     {idle}",
        f"{num_tokens_text(record.num_batched_tokens)} in the batch; after the step: {record.num_running} running, "
        f"{record.num_waiting} waiting",
    ]
    events = [
        f"{what} {', '.join(map(name, ids))}"
        for what, ids in (
            ("admitted", record.admitted_ids),
            ("preempted", record.preempted_ids),
            ("finished", record.finished_ids),
        )
        if ids
    ]
    if events:
        lines.append("; ".join(events))
    return "\n".join(lines)


def _chunk_text(n: int, span: tuple[int, int, int] | None) -> str:
    if span is None or (span[0] == 1 and span[1] >= span[2]):  # no span known, or the whole prompt at once
        return num_tokens_text(n)
    first, last, total = span
    return f"token {first} of {total}" if first == last else f"tokens {first}–{last} of {total}"


# --- the widget -------------------------------------------------------------------------------


class SlotsTimeline(FigureView):
    """The slots timeline with a step slider and a play button; the current step is outlined and
    described below the picture."""

    def __init__(self, trace, outputs, rows: str = "slots", max_queue_rows: int = 4, labels: dict | None = None):
        self.rows, self.max_queue_rows, self.labels = rows, max_queue_rows, labels
        self.slider = widgets.IntSlider(min=0, max=0, description="step", continuous_update=True)
        self.play = widgets.Play(min=0, max=0, interval=500, description="play")
        widgets.link((self.play, "value"), (self.slider, "value"))
        widgets.link((self.play, "max"), (self.slider, "max"))
        self.info = widgets.HTML()
        fig = Figure(figsize=(10, 3))
        self.ax = fig.add_subplot()
        super().__init__(fig, [widgets.HBox([self.play, self.slider])])
        self.widget.children += (self.info,)
        self.slider.observe(lambda change: self.show_step(change["new"]), names="value")
        self.set_data(trace, outputs)

    def set_data(self, trace, outputs) -> None:
        """Show another run (the controls widget calls this after every re-run)."""
        self.trace, self.outputs = trace, outputs
        self.slots = slots_per_step(trace)
        self.spans = prefill_spans(trace, outputs)
        self.grid = cell_grid(trace, outputs, self.rows, self.max_queue_rows, self.labels)
        self.fig.set_size_inches(*_figsize(self.grid))
        self.ax.clear()
        draw_grid(self.grid, self.ax, step=0)
        self.marker = next(p for p in self.ax.patches if p.get_gid() == "current-step") if len(trace) else None
        last = max(len(trace) - 1, 0)
        moves = self.slider.value > last
        self.slider.max = last  # pulls a step past the end back to the last step, and that redraws
        if not moves:
            self.show_step(self.slider.value)

    def show_step(self, step: int) -> None:
        """Move the outline to ``step`` and describe it."""
        if self.marker is not None:
            self.marker.set_x(step - 0.5)
            info = step_info(self.trace[step], self.slots[step], self.labels, self.spans[step])
            self.info.value = f"<pre>{html.escape(info)}</pre>"
        else:
            self.info.value = "no engine steps"
        self.refresh()


def slots_timeline(
    trace, outputs, rows: str = "slots", max_queue_rows: int = 4, labels: dict | None = None
) -> SlotsTimeline:
    return SlotsTimeline(trace, outputs, rows, max_queue_rows, labels)
