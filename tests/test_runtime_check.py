"""The grader's runtime check (``minillm.course.runtime_check``): whatever route a learner's code takes
to minillm's answer (or to ``solutions/``), the probe that ran it is refused, naming what ran; a graded
method left out is not implemented; and the rest of the learner's module is still graded.

The static reading (``minillm.course.delegation``, tested in test_delegation.py) is switched off
here, so each route below must be caught by what ran alone."""

import re
import textwrap

import pytest

from minillm.course import grade
from minillm.course.delegation import resolve
from minillm.course.exercises import BEGIN
from minillm.course.paths import REPO_ROOT
from minillm.course.runtime_check import TASKS, functions_under
from minillm.course.sandbox import Delegated, LearnerProcess

# Probes below run in a learner process, which imports this file by its path: no `tests.` imports.
pytestmark = pytest.mark.skipif(
    not (REPO_ROOT / "solutions").is_dir(), reason="a student copy of the course (make-release) has no solutions/"
)


def run(module, expression: str):
    """The probe: evaluate ``expression`` with the learner's module as ``ch`` (it uses the whole module)."""
    return eval(expression, {"ch": module})


def submission(tmp_path, module: str, appended: str) -> str:
    """The reference answer to ``module`` with ``appended`` after it, in a folder of its own."""
    folder = tmp_path / "submission"
    folder.mkdir(exist_ok=True)
    source = (REPO_ROOT / "solutions" / f"{module}.py").read_text()
    (folder / f"{module}.py").write_text(source + "\n\n" + textwrap.dedent(appended))
    return str(folder)


@pytest.fixture
def runtime_only(monkeypatch):
    """Switch the static reading off: only what runs decides."""
    monkeypatch.setattr(LearnerProcess, "_refuse_delegation", lambda self, used: None)


# --- every route to minillm's answer that a reading of the file misses, in one learner process ------
ROUTES = """  # appended to the reference answer; `TRICK` picks the route
import gc, importlib.util, inspect, os, pickle, pkgutil, runpy, sys, tempfile, threading, types

PAGED = PagedRunner.__init__.__code__.co_filename  # minillm/engines/paged.py
TRICK = None


def exec_module(path):
    spec = importlib.util.spec_from_file_location("copy_of_it", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.slot_mapping


def exec_text():
    namespace = {}
    vars(__import__("builtins"))["ex" + "ec"](open(PAGED).read(), namespace)
    return namespace["slot_mapping"]


def function_type():
    source = inspect.getsource(sys.modules["minillm.engines.paged"].slot_mapping)
    code = next(c for c in compile(source, "<copy>", "exec").co_consts if hasattr(c, "co_code"))
    return types.FunctionType(code, {})


def temp_helper():
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "helper_copy.py"), "w") as f:
        f.write(open(PAGED).read())
    sys.path.insert(0, folder)
    import helper_copy

    return helper_copy.slot_mapping


def in_a_thread():
    out = []
    real = sys.modules["minillm.engines.paged"].slot_mapping
    thread = threading.Thread(target=lambda *a: out.append(real(*a)), args=([[0]], [0], [1], 16))
    thread.start()
    thread.join()
    return lambda *a: out[0]


ROUTES = {
    "import inside": lambda: __import__("minillm.engines.paged", fromlist=["x"]).slot_mapping,
    "sys.modules": lambda: sys.modules["minillm.engines.paged"].slot_mapping,
    "__globals__": lambda: PagedRunner.__init__.__globals__["slot_mapping"],
    "pickle": lambda: pickle.loads(b"cminillm.engines.paged\\nslot_mapping\\n."),
    "pkgutil.resolve_name": lambda: pkgutil.resolve_name("minillm.engines.paged:slot_mapping"),
    "runpy.run_path": lambda: runpy.run_path(PAGED)["slot_mapping"],
    "runpy.run_module": lambda: runpy.run_module("minillm.engines.paged")["slot_mapping"],
    "exec_module": lambda: exec_module(PAGED),
    "exec_module solutions": lambda: exec_module(
        os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(PAGED))), "solutions", "ch05_paged.py")
    ),
    "exec": exec_text,
    "compile + FunctionType": function_type,
    "gc.get_objects": lambda: next(
        o
        for o in gc.get_objects()
        # minillm's live function, not a copy an earlier trick of this test left for the collector
        if isinstance(o, types.FunctionType)
        and o.__qualname__ == "slot_mapping"
        and o.__globals__ is vars(sys.modules["minillm.engines.paged"])
    ),
    "temp helper": temp_helper,
    "thread": in_a_thread,
}


def slot_mapping(block_tables, num_computed_tokens, num_scheduled_tokens, block_size):
    return ROUTES[TRICK]()(block_tables, num_computed_tokens, num_scheduled_tokens, block_size)


class MyPreemptingScheduler(PagedScheduler):
    def preempt(self, preempted, swap_out):
        if TRICK == "__mro__":
            return self.__class__.__mro__[1].preempt(self, preempted, swap_out)
        return type(self).__bases__[0].__dict__["preempt"](self, preempted, swap_out)
"""
SLOT_MAPPING = "ch.slot_mapping([[0]], [0], [1], 16)"
# a copy of paged.py holds three answers of the chapter: any may be named first
COPY_FILE = r"your code made a copy of minillm's own `minillm\.engines\.paged\.\S+` from its file"
COPY_TEXT = r"your code made a copy of minillm's own `minillm\.engines\.paged\.\S+` from its source text"
PREEMPT = "ch.MyPreemptingScheduler.preempt(object.__new__(ch.MyPreemptingScheduler), [], {})"
TRICKS = [
    ("import inside", SLOT_MAPPING, re.escape("minillm's own `minillm.engines.paged.slot_mapping` ran")),
    ("sys.modules", SLOT_MAPPING, re.escape("minillm's own `minillm.engines.paged.slot_mapping` ran")),
    ("__globals__", SLOT_MAPPING, re.escape("minillm's own `minillm.engines.paged.slot_mapping` ran")),
    ("pickle", SLOT_MAPPING, re.escape("minillm's own `minillm.engines.paged.slot_mapping` ran")),
    ("pkgutil.resolve_name", SLOT_MAPPING, re.escape("minillm's own `minillm.engines.paged.slot_mapping` ran")),
    ("runpy.run_path", SLOT_MAPPING, COPY_FILE),
    ("runpy.run_module", SLOT_MAPPING, COPY_FILE),
    ("exec_module", SLOT_MAPPING, COPY_FILE),
    ("exec_module solutions", SLOT_MAPPING, r"loaded the reference answers' code from solutions/ch05_paged\.py"),
    ("exec", SLOT_MAPPING, COPY_TEXT),
    ("compile + FunctionType", SLOT_MAPPING, COPY_TEXT),
    ("gc.get_objects", SLOT_MAPPING, re.escape("minillm's own `minillm.engines.paged.slot_mapping` ran")),
    ("temp helper", SLOT_MAPPING, COPY_TEXT),
    ("thread", SLOT_MAPPING, re.escape("ran (in a thread your code started)")),
    ("__mro__", PREEMPT, re.escape("minillm's own `minillm.engines.paged.PagedScheduler.preempt` ran")),
    ("__bases__", PREEMPT, re.escape("minillm's own `minillm.engines.paged.PagedScheduler.preempt` ran")),
]


def test_every_route_to_minillms_answer_is_refused_by_what_ran(tmp_path, runtime_only):
    folder = submission(tmp_path, "ch05_paged", ROUTES)
    with LearnerProcess("ch05_paged", impl=folder) as learner:
        for trick, expression, message in TRICKS:
            with pytest.raises(Delegated) as refused:
                learner.call(run, f"setattr(ch, 'TRICK', {trick!r}) or {expression}")
            assert re.search(message, str(refused.value)) and "not graded as yours" in str(refused.value), trick
        # the learner's own code in the same module is still graded: nothing is charged to it
        assert learner.call(run, "ch.MyBlockManager(4, 2).num_free_blocks") == 4


def test_the_solutions_guard_taken_out_of_sys_meta_path_is_no_way_in(tmp_path, runtime_only):
    folder = submission(
        tmp_path,
        "ch05_paged",
        """
        import sys

        def slot_mapping(*args):
            sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_AnswersRefused"]
            sys.path.insert(0, PagedRunner.__init__.__code__.co_filename.rsplit("/minillm/", 1)[0])
            from solutions.ch05_paged import slot_mapping as theirs

            return theirs(*args)
        """,
    )
    with LearnerProcess("ch05_paged", impl=folder) as learner:
        with pytest.raises(Delegated, match=r"loaded the reference answers' code from solutions/"):
            learner.call(run, SLOT_MAPPING)


# --- in every chapter with an exercise, the forms a learner writes without meaning to cheat --------
NATURAL = [
    (
        "ch01_naive",
        """
        def decode_loop(model, prompt_token_ids, max_tokens, eos_token_id=None):
            from minillm.engines.naive import greedy_decode_loop

            return greedy_decode_loop(model, prompt_token_ids, max_tokens, eos_token_id)
        """,
        "ch.decode_loop(None, [1], 1)",
        "minillm.engines.naive.greedy_decode_loop",
    ),
    (
        "ch01_naive",
        """
        def latency_metrics(arrival_time, token_times):
            from minillm.metrics import RequestMetrics

            m = RequestMetrics(arrival_time, first_token_time=token_times[0], token_times=token_times)
            return {"ttft": m.ttft, "itl": m.itl}
        """,
        "ch.latency_metrics(0.0, [1.0, 2.0])",
        "minillm.metrics.RequestMetrics",
    ),
    (
        "ch02_batching",
        """
        def left_pad(batch_token_ids, pad_id):
            from minillm.engines import static

            return static.left_pad(batch_token_ids, pad_id)
        """,
        "ch.left_pad([[1, 2], [3]], 0)",
        "minillm.engines.static.left_pad",
    ),
    (
        "ch03_scheduling",
        """
        class IterationLevelScheduler(ReservingScheduler):
            def schedule(self, now):
                from minillm.engines.continuous import ContinuousBatchScheduler

                return ContinuousBatchScheduler.schedule(self, now)
        """,
        "ch.IterationLevelScheduler.schedule(object.__new__(ch.IterationLevelScheduler), 0.0)",
        "minillm.engines.continuous.ContinuousBatchScheduler",
    ),
    (
        "ch04_selective",
        """
        def ragged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k):
            from minillm.attention.causal import causal_attention

            return causal_attention(q, k, v)
        """,
        "ch.ragged_attention(*[__import__('torch').zeros(2, 1, 4)] * 3, None, None)",
        "minillm.attention.causal.causal_attention",
    ),
    (
        "ch05_kernel",
        "from minillm.kernels.triton_paged_attention import _paged_attention_kernel as one_block_attention_kernel\n",
        "ch.one_block_attention_kernel",
        "`one_block_attention_kernel` in your module is `_paged_attention_kernel` from "
        "minillm/kernels/triton_paged_attention.py",
    ),
    (
        "ch05_paged",
        """
        class MyPreemptingScheduler(PagedScheduler):
            pass  # preempt left out: PagedScheduler's would be inherited
        """,
        "ch.MyPreemptingScheduler",
        "`MyPreemptingScheduler.preempt` is not written in your module",
    ),
    (
        "ch05_paged",
        "MyPreemptingScheduler = PagedScheduler.preempt\n",
        "ch.MyPreemptingScheduler",
        "`MyPreemptingScheduler` in your module is not a class",
    ),
    (
        "ch06_budget",
        """
        def choose_token_budget(profile, workload, itl_target, *args):
            from minillm.capacity.budget import choose_token_budget as theirs

            return theirs(profile, workload, itl_target, *args)
        """,
        "ch.choose_token_budget(None, None, 1.0)",
        "minillm.capacity.budget.choose_token_budget",
    ),
    (
        "ch06_chunked",
        """
        class MyChunkedScheduler(TokenBudgetScheduler):
            def schedule(self, now):
                subclasses = TokenBudgetScheduler.__subclasses__()
                (theirs,) = [k for k in subclasses if k.__name__ == "ChunkedPrefillScheduler"]
                return theirs.schedule(self, now)
        """,
        "ch.MyChunkedScheduler.schedule(object.__new__(ch.MyChunkedScheduler), 0.0)",
        "minillm.engines.chunked.ChunkedPrefillScheduler",
    ),
    (
        "ch07_prefix_caching",
        """
        def hash_block(parent_hash, token_ids):
            import minillm.kv.prefix_cache as pc

            return pc.hash_block(parent_hash, token_ids)
        """,
        "ch.hash_block(None, [1, 2])",
        "minillm.kv.prefix_cache.hash_block",
    ),
    (
        "ch08_capacity",
        """
        def measured_slice(num_requests, warmup, cooldown):
            from minillm.capacity.measure import measured_slice as theirs

            return theirs(num_requests, warmup, cooldown)
        """,
        "ch.measured_slice(10, 0.1, 0.1)",
        "minillm.capacity.measure.measured_slice",
    ),
    (
        "ch08_no_evict",
        """
        class MyNoEvictScheduler(TokenBudgetScheduler):
            def schedule(self, now):
                from minillm.engines import trtllm

                return trtllm.TRTLLMScheduler.schedule(self, now)
        """,
        "ch.MyNoEvictScheduler.schedule(object.__new__(ch.MyNoEvictScheduler), 0.0)",
        "minillm.engines.trtllm.TRTLLMScheduler",
    ),
    (
        "ch09_roofline",
        """
        def decode_step_floor(*args, **kwargs):
            from minillm.sim.cost_model import Profile

            return Profile.forward_cost(*args, **kwargs)
        """,
        "ch.decode_step_floor(None, 1, 1, 1, 1)",
        "minillm.sim.cost_model.Profile.forward_cost",
    ),
    (
        "ch10_tensor_parallel",
        """
        def split_mlp(mlp, tp_size):
            from types import SimpleNamespace

            from minillm.distributed import tensor_parallel

            named = {f"model.layers.0.mlp.{k}": v for k, v in mlp.state_dict().items()}
            model = SimpleNamespace(state_dict=lambda: named)
            return [tensor_parallel.shard_state_dict(model, rank, tp_size) for rank in range(tp_size)]
        """,
        "ch.split_mlp(__import__('torch').nn.Linear(4, 4), 2)",
        "minillm.distributed.tensor_parallel.shard_state_dict",
    ),
    (
        "ch10_tensor_parallel",
        """
        def shard_forward(shard, x):
            from minillm.distributed.tensor_parallel import RowParallelLinear

            class OneRank:  # an all-reduce over one rank: nothing to add
                def allreduce(self, tensors):
                    return self

                def wait(self):
                    pass

            h = F.silu(F.linear(x, shard.gate_weight, shard.gate_bias)) * F.linear(x, shard.up_weight, shard.up_bias)
            return RowParallelLinear(shard.down_weight, None, OneRank())(h)
        """,
        "ch.shard_forward(ch.MLPShard(*[__import__('torch').ones(2, 2)] * 3), __import__('torch').ones(1, 2))",
        "minillm.distributed.tensor_parallel.RowParallelLinear",
    ),
]


@pytest.mark.parametrize(
    ("module", "appended", "expression", "named"), NATURAL, ids=[f"{n[0]}-{i}" for i, n in enumerate(NATURAL)]
)
def test_a_natural_delegation_in_each_chapter_is_refused_by_what_ran(
    tmp_path, runtime_only, module, appended, expression, named
):
    with LearnerProcess(module, impl=submission(tmp_path, module, appended)) as learner:
        with pytest.raises((Delegated, NotImplementedError)) as refused:
            learner.call(run, expression)
    assert named in str(refused.value)


def test_every_chapter_with_an_exercise_has_a_natural_delegation_tested():
    assert {n[0] for n in NATURAL} == set(TASKS)


def test_the_graded_pieces_are_the_reference_answers_marked_bodies():
    """``TASKS`` names, per exercise, the functions and methods whose bodies ``# BEGIN SOLUTION``
    marks in ``solutions/``: the pieces that must be the learner's own definitions."""
    import ast

    for module, tasks in TASKS.items():
        source = (REPO_ROOT / "solutions" / f"{module}.py").read_text()
        marks = [i for i, line in enumerate(source.splitlines(), start=1) if line.strip() == BEGIN]
        marked = set()
        for node in ast.parse(source).body:
            inner = node.body if isinstance(node, ast.ClassDef) else [node]
            for fn in inner:
                if isinstance(fn, ast.FunctionDef) and any(fn.lineno <= m <= fn.end_lineno for m in marks):
                    marked.add(f"{node.name}.{fn.name}" if fn is not node else fn.name)
        assert {p for task in tasks.values() for p in task.graded} == marked, module


def test_a_left_out_method_costs_its_own_tests_only(tmp_path):
    """Graded end to end: a scheduler that inherits PagedScheduler's ``preempt`` earns nothing for
    the preemption tests, which say it is not written; the rest of ``ch05_paged`` still passes."""
    folder = submission(tmp_path, "ch05_paged", "class MyPreemptingScheduler(PagedScheduler):\n    pass\n")
    report = grade(["ch05_paged"], impl=folder, timeout=60)
    refused = [r for r in report.results if "MyPreemptingScheduler.preempt` is not written" in r.message]
    assert refused and all(r.status == "not_implemented" and not r.passed for r in refused)
    rest = [r for r in report.results if r not in refused]
    assert rest and all(r.passed for r in rest), report.table()


def test_every_answer_named_in_the_tasks_is_found_and_watched():
    """A misspelt name in ``TASKS`` would watch nothing: each resolves to functions of minillm's source."""
    for module, tasks in TASKS.items():
        for dotted in {a for task in tasks.values() for a in task.answers}:
            assert functions_under(resolve(dotted)), f"{module}: {dotted} names no function of minillm's"
