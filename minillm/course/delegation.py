"""Is the graded code the learner's own? Finding where a learner's module hands the task to minillm.

minillm contains an answer to every exercise: its engines *are* the course's answers. A learner's
``MyBlockManager`` that is minillm's ``BlockManager`` under another name, or a ``slot_mapping`` that
calls minillm's, would pass every grading test without the learner writing anything. So before a
grading test runs the learner's code, the grader reads the learner's module (it never imports it)
and finds every place where it reaches minillm:

* each name the module uses is resolved to the object it stands for, through its imports
  (``from minillm.kv import BlockManager as B``, ``import minillm.engines.paged as p`` then
  ``p.slot_mapping``), so a renamed import is found, and a comment or a string is not;
* what the exercise gives the learner to build on is allowed (``ALLOWED`` below: ``PagedScheduler``
  for the block manager exercise, the scheduler's vocabulary such as ``Request``), except the
  attributes that are the answer itself (``FORBIDDEN_ATTRIBUTES``: ``PagedRunner.slot_mapping``),
  reached directly or through ``super()``; anything else of minillm's is the answer, or part of it;
* a dynamic import, ``exec`` or ``getattr`` on minillm is refused too: the grader cannot see what
  it reaches.

Each finding is charged to the top-level function or class that contains it, and to everything of
the module that uses that one (a scheduler built on a delegated block manager tests the block
manager too); a finding at module level, outside any definition, is charged to the whole module.
A grading test then refuses to run a probe that uses a charged name (``LearnerProcess.call``), so
delegating one function costs the tests of that function, not the rest of the chapter.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import textwrap
import types
from dataclasses import dataclass

WHOLE_MODULE = "*"  # the name a finding at module level is charged to

# What every exercise may use: the engine's vocabulary, not an answer to anything.
VOCABULARY = (
    "minillm.request.Request",
    "minillm.request.RequestStatus",
    "minillm.sampling_params.SamplingParams",
    "minillm.scheduler.SchedulerOutput",
    "minillm.engines.paged.PagedSchedulerOutput",
)
# exercise module -> what the exercise gives the learner to build on
ALLOWED = {
    "ch01_naive": ("minillm.attention.contiguous.ContiguousKVCache",),
    "ch02_batching": ("minillm.engines.static.PaddedBatchRunner", "minillm.engines.static.StaticBatchScheduler"),
    "ch03_scheduling": ("minillm.engines.continuous.ReservingScheduler",),
    "ch04_selective": (),
    "ch05_paged": ("minillm.engines.paged.PagedRunner", "minillm.engines.paged.PagedScheduler"),
    "ch05_kernel": (
        "minillm.course.kernel_puzzles.launch_one_block",
        "minillm.course.kernel_puzzles.launch_paged_decode",
        "minillm.course.kernel_puzzles.decode_kernel_runner",
        "minillm.course.kernel_puzzles.launch_ragged",
        "minillm.course.kernel_puzzles.ragged_kernel_runner",
    ),
    "ch06_chunked": ("minillm.engines.chunked.TokenBudgetScheduler",),
    "ch06_budget": ("minillm.sim.simulate.simulate", "minillm.sim.cost_model.Profile", "minillm.workloads.Workload"),
    "ch07_prefix_caching": ("minillm.engines.chunked.ChunkedPrefillScheduler",),
    "ch08_capacity": (),
    "ch08_no_evict": ("minillm.engines.chunked.TokenBudgetScheduler",),
    "ch09_roofline": (),
    "ch10_tensor_parallel": ("minillm.models.llama.MLP",),  # the layer it splits, named in its annotations
}
# attributes of an allowed class that are the exercise's answer
FORBIDDEN_ATTRIBUTES = {
    "ch02_batching": (
        "minillm.engines.static.PaddedBatchRunner.left_pad",
        "minillm.engines.static.StaticBatchScheduler.form_batch",
    ),
    "ch05_paged": (
        "minillm.engines.paged.PagedRunner.slot_mapping",
        "minillm.engines.paged.PagedScheduler.block_manager_cls",
        "minillm.engines.paged.PagedScheduler.preempt",
    ),
    # the scheduler plugs the learner's allocator in: the allocator it names is the answer
    "ch07_prefix_caching": (
        "minillm.engines.chunked.ChunkedPrefillScheduler.block_manager_cls",
        "minillm.engines.chunked.ChunkedPrefillScheduler.prefix_caching_block_manager_cls",
    ),
    # the unsplit layer's forward is what a rank's SwiGLU must compute on its own slices
    "ch10_tensor_parallel": ("minillm.models.llama.MLP.forward",),
}
NOT_YOURS = "minillm's answer is not graded as yours. Write it yourself, from what the exercise gives you to build on."
DYNAMIC = {"__import__", "exec", "eval", "importlib.import_module", "importlib.__import__", "builtins.__import__"}


@dataclass(frozen=True)
class Delegation:
    name: str  # the learner's top-level function or class charged with it (WHOLE_MODULE at module level)
    line: int
    reaches: str  # what of minillm's it reaches, dotted, or the dynamic call

    def message(self, module: str) -> str:
        where = "your module" if self.name == WHOLE_MODULE else f"your `{self.name}`"
        return f"{where} uses minillm's own `{self.reaches}` ({module}.py, line {self.line}): {NOT_YOURS}"


def find_delegations(source: str, module: str) -> dict[str, Delegation]:
    """``{learner name: the first Delegation charged to it}`` for the exercise module ``module``
    (e.g. ``"ch05_paged"``), whose text is ``source``."""
    tree = ast.parse(source)
    allowed = {id(o) for o in map(resolve, (*VOCABULARY, *ALLOWED.get(module, ()))) if o is not None}
    forbidden = {id(o): n for n in FORBIDDEN_ATTRIBUTES.get(module, ()) if (o := resolve(n)) is not None}
    finder = _Finder(allowed, forbidden)
    for statement in _executed(tree.body):
        finder.visit_top_level(statement)
    charged = dict(finder.found)
    # Whatever uses a charged name is charged too, until nothing changes.
    changed = True
    while changed:
        changed = False
        for name, uses in finder.uses.items():
            if name in charged:
                continue
            hit = next((u for u in uses if u in charged), None)
            if hit is not None:
                d = charged[hit]
                charged[name] = Delegation(name, d.line, d.reaches)
                changed = True
    return charged


@functools.cache
def names_used(probe) -> frozenset[str] | None:
    """The attributes a grading probe reads from the learner's module, its first parameter; None
    when it hands the module on whole (then it may use anything). Read once per probe: every call
    of it (both checks of whose code answered) asks."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(probe)))
    function = tree.body[0]
    module = function.args.args[0].arg
    used, parents = set(), {}
    for node in ast.walk(function):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id == module and node is not function:
            parent = parents.get(node)
            if not isinstance(parent, ast.Attribute):
                return None
            used.add(parent.attr)
    return frozenset(used)  # cached: shared by every caller


def resolve(dotted: str):
    """The object ``dotted`` names (importing its module), or None if there is none."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        except Exception:  # a module that fails to import names nothing
            return None
        for attr in parts[i:]:
            try:
                obj = inspect.getattr_static(obj, attr)
            except AttributeError:
                return None
            if isinstance(obj, staticmethod | classmethod):
                obj = obj.__func__
        return obj
    return None


def _executed(body):
    """The statements that run on import: not those under ``if __name__ == "__main__":``."""
    for statement in body:
        if isinstance(statement, ast.If) and _is_main_guard(statement.test):
            yield from _executed(statement.orelse)
        else:
            yield statement


def _is_main_guard(test) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


class _Finder:
    """Walks the module once: import aliases, the top-level names, and what each one reaches."""

    def __init__(self, allowed: set[int], forbidden: dict[int, str]):
        self.allowed, self.forbidden = allowed, forbidden
        self.aliases: dict[str, str] = {}  # a module-level name bound by an import -> what it names, dotted
        self.found: dict[str, Delegation] = {}
        self.uses: dict[str, set[str]] = {}  # a top-level name -> the module's other top-level names it uses

    def visit_top_level(self, statement) -> None:
        if isinstance(statement, ast.Import | ast.ImportFrom):
            for alias in statement.names:
                self._bind(statement, alias)
            return
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            owners = [statement.name]
        elif isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            owners = [n for t in targets for n in _bound_roots(t)] or [WHOLE_MODULE]
        else:
            owners = [WHOLE_MODULE]
        bases = self._bases(statement) if isinstance(statement, ast.ClassDef) else []
        for node in ast.walk(statement):
            reaches = self._reaches(node, bases)
            for owner in owners:
                if reaches is not None and owner not in self.found:
                    self.found[owner] = Delegation(owner, node.lineno, reaches)
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                    self.uses.setdefault(owner, set()).add(node.id)

    def _bind(self, statement, alias) -> None:
        if isinstance(statement, ast.Import):
            name = alias.asname or alias.name.split(".")[0]
            self.aliases[name] = alias.name if alias.asname else name
        elif statement.level == 0 and alias.name != "*":
            name = alias.asname or alias.name
            self.aliases[name] = f"{statement.module}.{alias.name}"
        else:
            return
        reaches = self._verdict(self.aliases[name])
        if reaches is not None:
            self.found.setdefault(name, Delegation(name, statement.lineno, reaches))

    def _bases(self, cls: ast.ClassDef) -> list:
        """The class's bases that are minillm's (only minillm is imported here: the grader never
        imports a module the learner's code names)."""
        out = []
        for base in cls.bases:
            dotted = self._dotted(base)
            obj = resolve(dotted) if dotted and dotted.split(".")[0] == "minillm" else None
            if isinstance(obj, type):
                out.append(obj)
        return out

    def _reaches(self, node, bases) -> str | None:
        """What of minillm's ``node`` reaches when that is not allowed, else None."""
        if isinstance(node, ast.Attribute | ast.Name) and isinstance(node.ctx, ast.Load):
            dotted = self._dotted(node)
            if dotted is not None:
                return self._verdict(dotted)
        if isinstance(node, ast.Import | ast.ImportFrom):  # an import inside a function or class
            for alias in node.names:
                if isinstance(node, ast.Import):
                    dotted = alias.name
                elif node.level == 0:
                    dotted = node.module if alias.name == "*" else f"{node.module}.{alias.name}"
                else:
                    continue
                reaches = self._verdict(dotted)
                if reaches is not None:
                    return reaches
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and node.args:
            dotted = self._dotted(node.args[0])
            if dotted is not None and dotted.split(".")[0] == "minillm":
                return f"getattr({dotted}, ...)"
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "super"
        ):
            for base in bases:
                for klass in base.__mro__:
                    if node.attr in vars(klass):
                        target = vars(klass)[node.attr]
                        if id(target) in self.forbidden:
                            return self.forbidden[id(target)]
                        break
        return None

    def _dotted(self, node) -> str | None:
        """``a.b.c`` with ``a`` replaced by what its import names; None unless it starts at an import."""
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        if node.id in ("__import__", "exec", "eval") and not attrs:
            return node.id
        if node.id not in self.aliases:
            return None
        return ".".join([self.aliases[node.id], *reversed(attrs)])

    def _verdict(self, dotted: str) -> str | None:
        """``dotted`` if it reaches minillm's code beyond what is allowed, else None. Modules are
        walked through; the first object that is not a module decides."""
        if dotted in DYNAMIC:
            return dotted
        if dotted.split(".")[0] != "minillm":
            return None
        parts = dotted.split(".")
        for i in range(1, len(parts) + 1):
            obj = resolve(".".join(parts[:i]))
            if obj is None:
                return None  # a name minillm does not have: the import fails on its own
            if isinstance(obj, types.ModuleType):
                continue
            if id(obj) not in self.allowed:
                return ".".join(parts[:i])
            for j in range(i + 1, len(parts) + 1):  # an allowed class: its answer attributes are not
                attr = resolve(".".join(parts[:j]))
                if attr is not None and id(attr) in self.forbidden:
                    return self.forbidden[id(attr)]
            return None
        return None


def _bound_roots(target) -> list[str]:
    """The module-level names an assignment target binds or changes: ``x``, ``x.attr``, ``x[i]``."""
    if isinstance(target, ast.Tuple | ast.List):
        return [n for t in target.elts for n in _bound_roots(t)]
    while isinstance(target, ast.Attribute | ast.Subscript):
        target = target.value
    return [target.id] if isinstance(target, ast.Name) else []
