"""What ran: the grader's check, in the learner's process, that the code answering a probe is the learner's.

``minillm.course.delegation`` reads the learner's file before a probe runs and says clearly what it
found, but no reading follows every way Python reaches an object (an import inside a function,
``sys.modules``, ``pickle``, ``runpy``, a method left out and so inherited from minillm's class...).
So the learner's process also checks what is there and what runs, for each probe:

* before it: each graded function or method the probe uses (``TASKS``: the bodies the learner
  writes) is defined in the learner's file. One the learner's class leaves out, inheriting
  minillm's, is not implemented; one bound to code from elsewhere is delegated;
* while it runs: minillm's answers to the probe's tasks (``TASKS``) say when they run -- each was
  given a first line that reports (``minillm.course.instrument``), so every route to the function
  reaches the report -- and an answer run on the learner's behalf refuses the probe; a copy of an
  answer made from its source (``runpy``, ``exec``, ``importlib`` on minillm's file, ``compile``)
  or code from ``solutions/`` refuses it too, seen by an audit hook (``sys.addaudithook``) as the
  code is compiled or executed.

Nothing else is watched, so the check costs nothing while the rest of minillm runs: the model a
probe hands the learner's code, the classes an exercise gives to build on. Code written to attack
this process's own records is tampering, not delegation, and is not stopped here: reading the
submission shows it (the instructor's guide says what the grader promises).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path

from minillm.course.delegation import NOT_YOURS, resolve
from minillm.course.instrument import instrument, nested_codes
from minillm.course.paths import REPO_ROOT


@dataclass(frozen=True)
class Task:
    graded: tuple[str, ...]  # the learner's functions and methods whose bodies are the answer
    answers: tuple[str, ...]  # minillm's code that answers them (a class: every function it defines)


_BLOCK_MANAGER = Task(
    ("MyBlockManager.num_free_blocks", "MyBlockManager.allocate_slots", "MyBlockManager.free"),
    ("minillm.kv.block_manager.BlockManager",),
)
_SLOT_MAPPING = Task(
    ("slot_mapping",), ("minillm.engines.paged.slot_mapping", "minillm.engines.paged.PagedRunner.slot_mapping")
)
_PREFIX_CACHE = Task(
    (
        "hash_block",
        *(
            f"MyPrefixCachingBlockManager.{m}"
            for m in (
                "find_cached_blocks",
                "share_cached_blocks",
                "cache_full_blocks",
                "free",
                "take_free_block",
                "reset_prefix_cache",
            )
        ),
    ),
    (
        "minillm.kv.prefix_cache.hash_block",
        "minillm.kv.prefix_cache.FreeBlockQueue",
        "minillm.kv.prefix_cache.PrefixCachingBlockManager",
    ),
)
_FLOOR = ("minillm.sim.cost_model.Profile.forward_cost", "minillm.benchmarks.bench.floor_numbers")
_TENSOR_PARALLEL = (
    "minillm.distributed.tensor_parallel.shard_state_dict",
    "minillm.distributed.tensor_parallel.RowParallelLinear",
    "minillm.distributed.tensor_parallel.build_shard",
    "minillm.distributed.tensor_parallel.check_divides",
)

# exercise module -> a name of the learner's module that a probe uses -> what that probe grades
TASKS: dict[str, dict[str, Task]] = {
    "ch01_naive": {
        "decode_loop": Task(("decode_loop",), ("minillm.engines.naive.greedy_decode_loop", "minillm.llm.LLM")),
        "latency_metrics": Task(("latency_metrics",), ("minillm.metrics.RequestMetrics", "minillm.metrics.summarize")),
    },
    "ch02_batching": {
        "left_pad": Task(("left_pad",), ("minillm.engines.static.left_pad",)),
        "LeftPadRunner": Task(
            ("left_pad",), ("minillm.engines.static.left_pad", "minillm.engines.static.PaddedBatchRunner.left_pad")
        ),
        "form_batch": Task(("form_batch",), ("minillm.engines.static.form_batch",)),
        "FormBatchScheduler": Task(
            ("form_batch",),
            ("minillm.engines.static.form_batch", "minillm.engines.static.StaticBatchScheduler.form_batch"),
        ),
    },
    "ch03_scheduling": {
        "IterationLevelScheduler": Task(
            ("IterationLevelScheduler.schedule",), ("minillm.engines.continuous.ContinuousBatchScheduler",)
        ),
    },
    "ch04_selective": {
        "pack": Task(("pack",), ()),
        "unpack": Task(("unpack",), ()),
        "ragged_attention": Task(
            ("ragged_attention",),
            ("minillm.attention.ragged.RaggedKVCache", "minillm.attention.causal.causal_attention"),
        ),
    },
    "ch05_kernel": {
        name: Task(
            (name,),
            (
                "minillm.kernels.triton_paged_attention._paged_attention_kernel",
                "minillm.kernels.triton_paged_attention.triton_paged_attention",
                "minillm.kernels.paged_attention.paged_attention_reference",
                "minillm.kernels.paged_attention.paged_attention_torch",
            ),
        )
        for name in ("one_block_attention_kernel", "paged_decode_kernel", "ragged_paged_kernel")
    },
    "ch05_paged": {
        "MyBlockManager": _BLOCK_MANAGER,
        "MyBlockManagerScheduler": _BLOCK_MANAGER,
        "slot_mapping": _SLOT_MAPPING,
        "SlotMappingRunner": _SLOT_MAPPING,
        "MyPreemptingScheduler": Task(
            ("MyPreemptingScheduler.preempt",), ("minillm.engines.paged.PagedScheduler.preempt",)
        ),
    },
    "ch06_budget": {
        "choose_token_budget": Task(
            ("choose_token_budget",),
            ("minillm.capacity.budget.choose_token_budget", "minillm.capacity.budget.worst_itl_gap"),
        ),
    },
    "ch06_chunked": {
        "MyChunkedScheduler": Task(
            ("MyChunkedScheduler.schedule",), ("minillm.engines.chunked.ChunkedPrefillScheduler",)
        ),
    },
    "ch07_prefix_caching": {
        "hash_block": Task(("hash_block",), ("minillm.kv.prefix_cache.hash_block",)),
        "MyPrefixCachingBlockManager": _PREFIX_CACHE,
        "MyPrefixCachingScheduler": _PREFIX_CACHE,
    },
    "ch08_capacity": {
        "request_is_good": Task(("request_is_good",), ("minillm.capacity.measure.request_is_good",)),
        "measured_slice": Task(("measured_slice",), ("minillm.capacity.measure.measured_slice",)),
        "queue_grew": Task(
            ("queue_grew",), ("minillm.capacity.measure.is_overloaded", "minillm.capacity.measure.mean_waiting")
        ),
    },
    "ch08_no_evict": {
        "MyNoEvictScheduler": Task(("MyNoEvictScheduler.schedule",), ("minillm.engines.trtllm.TRTLLMScheduler",)),
    },
    "ch09_roofline": {
        "decode_step_floor": Task(("decode_step_floor",), _FLOOR),
        "crossover_batch": Task(("crossover_batch", "decode_step_floor"), _FLOOR),
    },
    "ch10_tensor_parallel": {
        "split_mlp": Task(("split_mlp",), _TENSOR_PARALLEL),
        "shard_forward": Task(("shard_forward",), _TENSOR_PARALLEL),
        "all_reduce": Task(("all_reduce",), _TENSOR_PARALLEL),
        "parallel_mlp": Task(("parallel_mlp", "shard_forward", "all_reduce"), _TENSOR_PARALLEL),
    },
}


def tasks_of(module: str, used: frozenset[str] | None) -> list[Task]:
    """The tasks a probe that uses ``used`` of the learner's ``module`` grades (None: it may use anything)."""
    tasks = TASKS.get(module, {})
    return [task for name, task in tasks.items() if used is None or name in used]


def code_of(obj):
    """The code object under a function, method, property or Triton kernel; None for anything else."""
    return getattr(_function(getattr(obj, "fn", obj)), "__code__", None)  # a @triton.jit kernel's .fn


def check_definitions(learner, tasks: list[Task]) -> tuple[str, str] | None:
    """``(status, message)`` for the first graded piece of ``tasks`` that is not the learner's own
    definition in the learner's file, else None."""
    mine = os.path.realpath(learner.__file__)
    for piece in dict.fromkeys(p for task in tasks for p in task.graded):
        owner_name, _, method = piece.partition(".")
        owner = vars(learner).get(owner_name)
        if owner is None:
            return "not_implemented", f"your module has no `{owner_name}`"
        if method:
            if not isinstance(owner, type):
                return "not_implemented", f"`{owner_name}` in your module is not a class"
            if method not in vars(owner):
                return "not_implemented", (
                    f"`{piece}` is not written in your module: without it your class inherits minillm's, "
                    "which is not graded as yours"
                )
            owner = vars(owner)[method]
        code = code_of(owner)
        if code is None or os.path.realpath(code.co_filename) != mine:
            what = f"`{code.co_qualname}` from {_relative(code.co_filename)}" if code else f"a {type(owner).__name__}"
            return "delegated", f"`{piece}` in your module is {what}, not a definition in your file: {NOT_YOURS}"
    return None


class Guard:
    """In the learner's process: minillm's answers to the exercise's tasks report when they run, and
    copies of them when they are made; during a probe (``probing``) a report on the learner's behalf
    is kept in ``found``.

    On the learner's behalf: the learner's file is on the stack, or a frame's ``self`` (or ``cls``)
    is of a class the learner's module defines (a method it inherits, a class it plugs in), or the
    answer runs in a thread other than the main one. What the probe itself runs (building the model
    it hands to the learner's code, say) is the grader's, not the learner's."""

    def __init__(self, module: str, grades_the_answers: bool):
        self.learner_file, self.learner_classes = "", ()  # the probe's learner module's (``probing``)
        self.solutions = None if grades_the_answers else str((REPO_ROOT / "solutions").resolve()) + os.sep
        self._places: dict[tuple[str, str], str] = {}  # (file, qualname) -> the answer's dotted name
        self._prints: dict[tuple, str] = {}  # (name, bytecode, names used) of an answer's function -> dotted
        self._names: set[str] = set()  # those functions' names
        answers = {a for task in TASKS.get(module, {}).values() for a in task.answers}
        for dotted in sorted(answers):
            for fn in functions_under(resolve(dotted)):
                self._prints[_fingerprint(fn.__code__)] = dotted
                self._names.add(fn.__code__.co_name)
                for code in nested_codes(fn.__code__):
                    self._places[(os.path.realpath(code.co_filename), code.co_qualname)] = dotted
                instrument(fn, functools.partial(self._ran, dotted))
        self._current: set[str] | None = None  # the running probe's answers; None between probes
        self._busy = False  # compiling inside the audit hook, which audits itself
        self.found: str | None = None
        sys.addaudithook(self._audit)  # for the rest of this process: an audit hook cannot be removed

    @contextlib.contextmanager
    def probing(self, tasks: list[Task], learner):
        """While a probe runs ``learner``'s code for ``tasks``."""
        self.learner_file = os.path.realpath(learner.__file__)
        self.learner_classes = tuple(
            v for v in vars(learner).values() if isinstance(v, type) and v.__module__ == learner.__name__
        )
        self._current, self.found = {a for task in tasks for a in task.answers}, None
        try:
            yield self
        finally:
            self._current = None

    def _ran(self, dotted: str) -> None:
        """The first line of minillm's answer ``dotted``: it is running."""
        if self._current is None or dotted not in self._current or self.found is not None:
            return
        how = self._on_behalf(sys._getframe(2))  # 1 is the answer's own frame
        if how is not None:
            self.found = f"minillm's own `{dotted}` ran{how}"

    def _on_behalf(self, frame) -> str | None:
        """How the learner's code led to ``frame`` (None: it did not)."""
        if threading.current_thread() is not threading.main_thread():
            return " (in a thread your code started)"
        while frame is not None:
            code = frame.f_code
            if _real(code.co_filename) == self.learner_file:
                return f" (reached from your {Path(self.learner_file).name}, line {frame.f_lineno})"
            first = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
            mine = [k for k in self.learner_classes if isinstance(first, k) or first is k]
            if mine:
                return f" (run for your `{mine[0].__name__}`)"
            frame = frame.f_back
        return None

    def _audit(self, event: str, args) -> None:
        """Code compiled or executed during a probe: is it a copy of an answer, or the reference's?"""
        if self._current is None or self.found is not None or self._busy:
            return
        if event == "exec" and hasattr(args[0], "co_code"):
            codes = [args[0]]
        elif event == "compile" and args[0] is not None:
            self._busy = True
            try:
                codes = [compile(args[0], args[1] or "<unknown>", "exec", dont_inherit=True)]
            except (SyntaxError, ValueError, TypeError):  # it will fail for the learner's code too
                codes = []
            finally:
                self._busy = False
        else:
            return
        for code in (c for top in codes for c in nested_codes(top)):
            self.found = self._copy_of(code)
            if self.found is not None:
                return

    def _copy_of(self, code) -> str | None:
        """What ``code``, about to be made or run, is when it is an answer's copy or the reference's.
        (Cheap tests first: importing a library during a probe brings thousands of code objects.)"""
        path = _real(code.co_filename)
        if self.solutions is not None and path.startswith(self.solutions):
            return f"your code loaded the reference answers' code from {_relative(path)}"
        dotted = self._places.get((path, code.co_qualname))
        if dotted is not None and dotted in self._current and not _being_imported(path):
            return f"your code made a copy of minillm's own `{dotted}` from its file"
        if code.co_name not in self._names or path == self.learner_file:
            return None
        dotted = self._prints.get(_fingerprint(code))
        if dotted is not None and dotted in self._current:
            return f"your code made a copy of minillm's own `{dotted}` from its source text"
        return None


def _being_imported(path: str) -> bool:
    """Is minillm's module at ``path`` being imported now, as itself (not re-run by ``runpy`` or
    loaded again under another name)?"""
    if not path.startswith(MINILLM_DIR):
        return False
    name = ".".join(Path(path).relative_to(Path(MINILLM_DIR).parent).with_suffix("").parts).removesuffix(".__init__")
    spec = getattr(sys.modules.get(name), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def functions_under(obj) -> list:
    """The functions of minillm's source under a function, method, property or kernel, or under every
    one a class defines (not those a decorator such as ``@dataclass`` wrote at run time: no answer is)."""
    if obj is None:
        return []
    obj = getattr(obj, "fn", obj)  # a @triton.jit kernel's Python function
    found = [_function(v) for v in vars(obj).values()] if isinstance(obj, type) else [_function(obj)]
    return [
        f
        for f in found
        if isinstance(f, types.FunctionType) and os.path.realpath(f.__code__.co_filename).startswith(MINILLM_DIR)
    ]


def _function(obj):
    """The function under a static or class method, a property's getter, or a decorator such as
    ``@torch.inference_mode()``."""
    if isinstance(obj, staticmethod | classmethod):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = obj.fget
    return inspect.unwrap(obj) if callable(obj) else obj


MINILLM_DIR = str(Path(__file__).resolve().parents[1]) + os.sep


@functools.cache
def _real(filename: str) -> str:
    return os.path.realpath(filename)


def _fingerprint(code) -> tuple:
    return code.co_name, code.co_code, code.co_names


def _relative(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return path
