"""Controls that re-run a workload: pick an engine, its ``max_num_seqs``, an arrival rate and a
length mix, and watch the slots timeline, the latency timeline and the summary numbers change. For
an engine with a token budget (``chunked``, chapter 6) a ``max_num_batched_tokens`` slider appears.

Every change calls ``run(engine, max_num_seqs, rate, mix) -> (outputs, trace)``, with
``max_num_batched_tokens=`` added for an engine that takes it, when ``run`` accepts it. The default run
is the simulator (``minillm.sim``): the real schedulers timed by a cost model, fast enough to redo
on every slider move. ``llm_run`` gives the same controls real runs of a model instead.

    from minillm.widgets import simulation_controls
    simulation_controls()
"""

from __future__ import annotations

import html
import inspect
import math

import ipywidgets as widgets
from matplotlib.figure import Figure

from minillm import workloads
from minillm.engines import BUILDERS, ENGINE_CHAPTERS, ENGINE_OPTIONS, REQUESTS_AT_ONCE
from minillm.engines.chunked import DEFAULT_MAX_NUM_BATCHED_TOKENS
from minillm.llm import LLM
from minillm.metrics import percentile_note, summarize
from minillm.sim import simulate
from minillm.sim.simulate import DEFAULT_PROFILE
from minillm.widgets.figure_view import StaticFallback, figure_png
from minillm.widgets.latency import LatencyTimeline, draw_latency
from minillm.widgets.slots import SlotsTimeline, draw_grid

# The budget slider's stops: powers of two from a few tokens (a prompt spread over many steps) to
# vLLM V1's throughput settings.
BUDGETS = tuple(2**k for k in range(4, 14))  # 16 .. 8192


def takes_budget(engine: str) -> bool:
    """Whether ``engine`` takes ``max_num_batched_tokens`` (a per-step token budget, chapter 6)."""
    return "max_num_batched_tokens" in ENGINE_OPTIONS.get(engine, {})


def engine_kwargs(engine: str, max_num_seqs: int, max_num_batched_tokens: int | None = None) -> dict:
    """``max_num_seqs`` for the engines that take it, under each engine's name for it (the naive engine
    runs one request at a time), and ``max_num_batched_tokens`` (when given) for the engines with a token
    budget."""
    kwargs = {REQUESTS_AT_ONCE[engine]: max_num_seqs} if engine in REQUESTS_AT_ONCE else {}
    if max_num_batched_tokens is not None and takes_budget(engine):
        kwargs["max_num_batched_tokens"] = max_num_batched_tokens
    return kwargs


def accepts_budget(run) -> bool:
    """Whether a run function takes a ``max_num_batched_tokens=`` keyword (older ones take four values)."""
    try:
        params = inspect.signature(run).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is p.VAR_KEYWORD or (p.name == "max_num_batched_tokens" and p.kind is not p.POSITIONAL_ONLY)
        for p in params
    )


def simulated_run(num_requests: int = 32, profile: str | None = None, seed: int = 0):
    """A run function backed by ``minillm.sim.simulate``: ``num_requests`` from the mix, timed by
    ``profile`` (the simulator's default when None)."""

    def run(engine, max_num_seqs, rate, mix, max_num_batched_tokens=None):
        workload = workloads.mix_workload(mix, num_requests, rate, seed=seed)
        kwargs = {} if profile is None else {"profile": profile}
        result = simulate(engine, workload, **kwargs, **engine_kwargs(engine, max_num_seqs, max_num_batched_tokens))
        return result.outputs, result.trace

    run.describe = (
        f"simulated: {profile or DEFAULT_PROFILE} (a cost model, not a measurement), "
        f"{num_requests} requests from the mix"
    )
    return run


def llm_run(model="tiny", num_requests: int = 12, seed: int = 0, **llm_options):
    """A run function backed by real ``LLM`` runs (wall-clock times). One ``LLM`` per engine
    setting is built on first use and kept."""
    llms = {}

    def run(engine, max_num_seqs, rate, mix, max_num_batched_tokens=None):
        options = engine_kwargs(engine, max_num_seqs, max_num_batched_tokens)
        key = (engine, *options.items())
        if key not in llms:
            llms[key] = LLM(model, engine=engine, seed=seed, **llm_options, **options)
        llm = llms[key]
        workload = workloads.mix_workload(mix, num_requests, rate, vocab_size=llm.config.vocab_size, seed=seed)
        outputs = llm.generate(workload.prompts, workload.sampling_params, workload.arrival_times)
        return outputs, llm.trace

    run.describe = f"measured: real runs of {model} on this machine, {num_requests} requests from the mix"
    return run


def summary_html(outputs, trace) -> str:
    """Throughput and the p50 / p95 latencies of one run, as a small HTML table (ms)."""
    s = summarize(outputs, trace)
    rows = [
        ("TTFT", "time_to_first_token_seconds"),
        ("ITL", "inter_token_latency_seconds"),
        ("e2e", "e2e_request_latency_seconds"),
    ]
    longest = {  # the summary keeps percentiles; the max is the stall a stream saw
        "time_to_first_token_seconds": max(o.metrics.ttft for o in outputs),
        "inter_token_latency_seconds": max((gap for o in outputs for gap in o.metrics.itl), default=float("nan")),
        "e2e_request_latency_seconds": max(o.metrics.e2e for o in outputs),
    }
    cells = "".join(
        f"<tr><td>{label}</td><td>{s[key]['p50'] * 1e3:.1f}</td><td>{s[key]['p95'] * 1e3:.1f}</td>"
        f"<td>{longest[key] * 1e3:.1f}</td></tr>"
        for label, key in rows
    )
    return (
        f"<b>{s['output_throughput_tokens_per_second']:.0f} output tok/s</b>, "
        f"{s['request_throughput_per_second']:.2f} req/s, {len(trace)} steps, {s['num_requests']} requests"
        f"<table><tr><th></th><th>p50 ms</th><th>p95 ms</th><th>max ms</th></tr>{cells}</table>"
        f"<small>TTFT and e2e have one value per request: {percentile_note(95, s['num_requests'])}. ITL pools every "
        "gap of every request, so its p95 describes many more values, and long answers weigh more; "
        "its max is the longest stall any stream saw.</small>"
    )


def available_engines() -> list[str]:
    return [name for name in ENGINE_CHAPTERS if name in BUILDERS]


class SimulationControls(StaticFallback):
    """Engine, ``max_num_seqs``, arrival rate and length mix, and for an engine with a token budget
    ``max_num_batched_tokens`` (shown only then); every change re-runs and redraws."""

    def __init__(
        self,
        run=None,
        engine: str = "continuous",
        max_num_seqs: int = 4,
        rate: float = 20.0,
        mix: str = "support chat: short answers + long summaries",
        engines=None,
        max_slots: int = 16,
        rate_range: tuple[float, float] = (1.0, 1000.0),
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    ):
        self.run_fn = run or simulated_run()
        style = {"description_width": "initial"}
        self.engine = widgets.Dropdown(options=engines or available_engines(), value=engine, description="engine")
        self.max_num_seqs = widgets.IntSlider(
            value=max_num_seqs, min=1, max=max_slots, description="max_num_seqs", continuous_update=False, style=style
        )
        self.rate = widgets.FloatLogSlider(
            value=rate,
            base=10,
            min=math.log10(rate_range[0]),
            max=math.log10(rate_range[1]),
            description="arrivals / s",
            continuous_update=False,
            style=style,
        )
        self.mix = widgets.Dropdown(
            options=list(workloads.LENGTH_MIXES),
            value=mix,
            description="length mix",
            style=style,
            layout=widgets.Layout(width="460px"),  # the longest mix's name, whole
        )
        budgets = sorted({*BUDGETS, max_num_batched_tokens})
        self.max_num_batched_tokens = widgets.SelectionSlider(
            options=budgets,
            value=max_num_batched_tokens,
            description="max_num_batched_tokens",
            continuous_update=False,
            style=style,
            layout=widgets.Layout(width="420px"),
        )
        self.status = widgets.HTML()
        self.summary = widgets.HTML()
        self.outputs, self.trace = self._run()
        self.slots = SlotsTimeline(self.trace, self.outputs)
        self.latency = LatencyTimeline(self.outputs)
        self.summary.value = summary_html(self.outputs, self.trace)
        self._sync_enabled()
        self.status.value = self.hint(self.outputs)
        for control in (self.engine, self.max_num_seqs, self.rate, self.mix, self.max_num_batched_tokens):
            control.observe(self.rerun, names="value")
        describe = getattr(self.run_fn, "describe", "")
        self.header = widgets.HTML(f"<b>{html.escape(describe)}</b>" if describe else "")
        controls = widgets.VBox(
            [
                widgets.HBox([self.engine, self.max_num_seqs]),
                widgets.HBox([self.rate, self.mix]),
                self.max_num_batched_tokens,
                self.status,
            ],
            layout=widgets.Layout(flex="0 0 auto"),  # never squeezed by the summary beside it
        )
        # One picture at a time, beside the controls that change it: the page stays one screen tall.
        self.pictures = widgets.Tab(children=[self.slots.widget, self.latency.widget])
        for i, title in enumerate(("slots, step by step", "latency per request")):
            self.pictures.set_title(i, title)
        # The summary sits beside the controls on a wide screen and wraps below them on a narrow one.
        top = widgets.HBox([controls, self.summary], layout=widgets.Layout(flex_flow="row wrap"))
        self.widget = widgets.VBox([self.header, top, self.pictures])

    def values(self) -> tuple:
        return self.engine.value, self.max_num_seqs.value, self.rate.value, self.mix.value

    def budget(self) -> int | None:
        """The token budget the run gets: the slider's value for an engine that takes one, else None."""
        return self.max_num_batched_tokens.value if takes_budget(self.engine.value) else None

    def _run(self):
        budget = self.budget()
        if budget is not None and accepts_budget(self.run_fn):
            return self.run_fn(*self.values(), max_num_batched_tokens=budget)
        return self.run_fn(*self.values())

    def rerun(self, change=None) -> None:
        """Run with the current control values and redraw everything. A run that fails (say, an
        engine a later chapter builds) shows its message and leaves the last pictures up."""
        self._sync_enabled()
        try:
            outputs, trace = self._run()
        except (ValueError, NotImplementedError) as e:
            self.status.value = f"<span style='color:#d55e00'>{html.escape(str(e))}</span>"
            return
        self.status.value = self.hint(outputs)
        self.outputs, self.trace = outputs, trace
        self.summary.value = summary_html(outputs, trace)
        self.slots.set_data(trace, outputs)
        self.latency.set_data(outputs)

    def hint(self, outputs) -> str:
        """What the run's settings mean for the picture, where a change would otherwise show nothing."""
        budget = self.budget()
        if budget is None or not outputs:
            return ""
        longest = max(len(o.prompt_token_ids) for o in outputs)
        if budget >= longest + self.max_num_seqs.value:
            return (
                f"<span style='color:#555'>a budget of {budget} holds this run's longest prompt "
                f"({longest} tokens) whole, "
                "beside a decode per slot: no prompt is cut, so the engine runs as <code>paged</code> would. "
                "Lower the budget to cut prompts into chunks.</span>"
            )
        return ""

    def _sync_enabled(self) -> None:
        self.max_num_seqs.disabled = not engine_kwargs(self.engine.value, 1)
        budget = takes_budget(self.engine.value) and accepts_budget(self.run_fn)
        self.max_num_batched_tokens.disabled = not budget
        self.max_num_batched_tokens.layout.display = None if budget else "none"

    def static_png(self) -> bytes:
        """Both timelines and the control values in one picture."""
        fig = Figure(figsize=(12, 10))
        top, bottom = fig.subfigures(2, 1, height_ratios=(1, 1.2))
        draw_grid(self.slots.grid, top.add_subplot(), step=None)
        engine, seqs, rate, mix = self.values()
        budget = f"  max_num_batched_tokens={self.budget()}" if not self.max_num_batched_tokens.disabled else ""
        top.suptitle(f"engine={engine}  max_num_seqs={seqs}{budget}  {rate:.1f} arrivals/s  mix: {mix}", fontsize=10)
        draw_latency(self.outputs, bottom, self.latency.max_requests)
        return figure_png(fig)


def simulation_controls(run=None, **options) -> SimulationControls:
    return SimulationControls(run, **options)
