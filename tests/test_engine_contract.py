"""``scheduler_cls=`` / ``runner_cls=`` accept any class that has what the engine loop uses.

A course exercise's class must not inherit its own answer, so the engine checks what a plugged-in
class implements, not what it extends.
"""

import pytest
import torch

from minillm import LLM, SamplingParams, workloads
from minillm.engines import RUNNER_CONTRACT, SCHEDULER_CONTRACT, build_engine
from minillm.engines.continuous import ContinuousBatchScheduler, ReservingScheduler
from minillm.engines.naive import ModelRunner
from minillm.sim import simulate
from minillm.sim.cost_model import Profile
from minillm.sim.simulate import build_sim_engine
from tests.test_course import needs_solutions


@pytest.fixture
def exercise_cls():
    """Chapter 3's exercise class, as the reference answer writes it (a student copy has none)."""
    from solutions.ch03_scheduling import IterationLevelScheduler

    return IterationLevelScheduler


@pytest.fixture(scope="module")
def model(tiny):
    return tiny.model


class OneAtATime:
    """A scheduler that extends nothing: one request at a time, run to completion. It has the whole
    interface ``minillm.scheduler.Scheduler`` declares, written out."""

    kv_capacity_tokens = 0
    num_gpu_blocks = block_size = None
    enable_prefix_caching = False

    def __init__(self, max_num_seqs=1, num_kv_tokens=None):
        self.waiting, self.running, self.slots, self.requests = [], [], {}, {}

    def check_request(self, request):
        pass

    def add_request(self, request):
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def finish_requests(self, request_ids, finish_reason):
        ids = [request_ids] if isinstance(request_ids, str) else request_ids
        ended = [self.requests.pop(rid) for rid in ids if rid in self.requests]
        for request in ended:
            (self.running if request in self.running else self.waiting).remove(request)
            request.finish_reason = finish_reason
        self.slots = {r.request_id: 0 for r in self.running}
        return ended

    def has_unfinished_requests(self):
        return bool(self.requests)

    def schedule(self, now):
        from minillm.scheduler import SchedulerOutput

        admitted = []
        if not self.running and self.waiting:
            self.running.append(self.waiting.pop(0))
            self.slots = {self.running[0].request_id: 0}
            admitted.append(self.running[0].request_id)
        return SchedulerOutput(
            list(self.running),
            {r.request_id: r.num_tokens - r.num_computed_tokens for r in self.running},
            admitted,
            slots=self.slots,
        )

    def stats(self):
        return {"num_running": len(self.running), "num_waiting": len(self.waiting), "kv_cache_usage": 0.0}

    def changed_block_tables(self):
        return None


def test_a_scheduler_that_extends_nothing_runs_the_engine(model, tiny):
    engine = build_engine("continuous", model, torch.device("cpu"), None, scheduler_cls=OneAtATime, max_num_seqs=4)
    assert type(engine.scheduler) is OneAtATime
    llm = LLM(tiny, engine="continuous", scheduler_cls=OneAtATime)
    naive = tiny
    prompts, params = ["minillm", "!!!"], SamplingParams(max_tokens=4, ignore_eos=True)
    assert [o.token_ids for o in llm.generate(prompts, params)] == [
        o.token_ids for o in naive.generate(prompts, params)
    ]


@pytest.mark.parametrize("missing", SCHEDULER_CONTRACT)
def test_a_scheduler_missing_part_of_the_contract_is_named(model, missing):
    class Lacking(OneAtATime):
        def __getattribute__(self, name):
            if name == missing:
                raise AttributeError(name)
            return super().__getattribute__(name)

    with pytest.raises(ValueError, match=rf"scheduler_cls=Lacking lacks {missing}: the engine needs"):
        build_engine("continuous", model, torch.device("cpu"), None, scheduler_cls=Lacking)


@pytest.mark.parametrize("missing", RUNNER_CONTRACT)
def test_a_runner_missing_part_of_the_contract_is_named(model, missing):
    methods = {name: lambda self, *args: None for name in RUNNER_CONTRACT if name != missing}
    Lacking = type("Lacking", (), {"__init__": lambda self, model, device: None, **methods})
    with pytest.raises(ValueError, match=rf"runner_cls=Lacking lacks {missing}: the engine needs"):
        build_engine("selective", model, torch.device("cpu"), None, runner_cls=Lacking)


def test_every_missing_name_is_listed_and_a_non_class_is_refused(model):
    Empty = type("Empty", (), {"__init__": lambda self, model, device: None})
    with pytest.raises(ValueError, match="runner_cls=Empty lacks execute_model, free, kv_tokens, kv_allocated_tokens"):
        build_engine("naive", model, torch.device("cpu"), None, runner_cls=Empty)
    with pytest.raises(ValueError, match="scheduler_cls must be a class"):
        build_engine("naive", model, torch.device("cpu"), None, scheduler_cls=OneAtATime())


def test_any_runner_with_the_contract_fits(model):
    engine = build_engine("selective", model, torch.device("cpu"), None, runner_cls=ModelRunner)
    assert type(engine.runner) is ModelRunner


@needs_solutions
def test_the_simulator_runs_a_scheduler_that_extends_nothing(exercise_cls):
    w = workloads.fixed(prompt_lens=[4, 6, 2], output_lens=[3, 2, 5])
    got = simulate("continuous", w, profile="cpu-tiny", scheduler_cls=OneAtATime)
    expected = simulate("naive", w, profile="cpu-tiny")
    assert got.trace.column("admitted_ids") == expected.trace.column("admitted_ids")
    exercise = simulate("continuous", w, profile="cpu-tiny", scheduler_cls=exercise_cls, max_num_seqs=2)
    own = simulate("continuous", w, profile="cpu-tiny", max_num_seqs=2)
    assert exercise.trace.column("admitted_ids") == own.trace.column("admitted_ids")


def test_the_simulator_needs_a_runner_it_can_time():
    class Unknown:
        def __init__(self, model, device):
            pass

        execute_model = free = kv_tokens = kv_allocated_tokens = lambda self, *args: None

    with pytest.raises(ValueError, match="runner_cls=Unknown extends none of the runners the simulator can time"):
        build_sim_engine("selective", Profile.load("cpu-tiny"), runner_cls=Unknown)


def test_a_scheduler_must_take_the_engines_options(model):
    with pytest.raises(
        ValueError,
        match=r"scheduler_cls=ContinuousBatchScheduler cannot be built with engine 'static'.*max_queue_delay",
    ):
        build_engine("static", model, torch.device("cpu"), None, scheduler_cls=ContinuousBatchScheduler)


@needs_solutions
def test_chapter_3_exercise_cannot_reach_its_answer_by_inheritance(exercise_cls):
    """It extends the bookkeeping (``ReservingScheduler``), never ``ContinuousBatchScheduler``, and no
    base offers a part of ``schedule()``: planning, or the KV admission test."""
    bases = exercise_cls.__mro__[1:]
    assert ReservingScheduler in bases and ContinuousBatchScheduler not in bases
    helpers = sorted({name for base in bases for name in vars(base) if "plan" in name or "fit" in name})
    assert not helpers, f"a base class of the exercise offers part of schedule(): {helpers}"
    with pytest.raises(NotImplementedError):
        super(exercise_cls, exercise_cls()).schedule(0.0)  # what `return super().schedule(now)` would return


def test_a_schedulers_own_type_error_is_not_blamed_on_the_engines_options(model):
    """Only a call that does not fit ``__init__``'s signature is reported as the options' fault."""

    class Broken(OneAtATime):
        def __init__(self, max_num_seqs=1, num_kv_tokens=None):
            len(max_num_seqs)  # the learner's own bug

    with pytest.raises(TypeError, match="has no len"):
        build_engine("continuous", model, torch.device("cpu"), None, scheduler_cls=Broken)


@needs_solutions
def test_chapter_6_exercise_cannot_reach_its_answer_by_inheritance():
    """It extends ``TokenBudgetScheduler`` (the options and plan helpers), never ``ChunkedPrefillScheduler``;
    no base offers the budget split, and the inherited ``schedule()`` is chapter 5's, which ignores the budget."""
    from minillm.engines.chunked import ChunkedPrefillScheduler, TokenBudgetScheduler
    from minillm.engines.paged import PagedScheduler
    from minillm.request import Request
    from solutions.ch06_chunked import MyChunkedScheduler

    bases = MyChunkedScheduler.__mro__[1:]
    assert TokenBudgetScheduler in bases and ChunkedPrefillScheduler not in bases
    helpers = sorted(
        {name for base in bases for name in vars(base) if "num_new_tokens" in name or "admit_from" in name}
    )
    assert not helpers, f"a base class of the exercise offers part of schedule(): {helpers}"
    assert TokenBudgetScheduler.schedule is PagedScheduler.schedule
    scheduler = MyChunkedScheduler(max_num_batched_tokens=8, block_size=4)
    scheduler.add_request(Request("0", list(range(20)), SamplingParams(max_tokens=2), 0.0))
    plan = super(MyChunkedScheduler, scheduler).schedule(0.0)  # what `return super().schedule(now)` would return
    assert plan.num_scheduled_tokens == {"0": 20}  # the whole prompt, over the budget of 8
