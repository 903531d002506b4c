"""The package's shape: layers that import only downwards, no import cycles, and a module map that
lists every module (``minillm/README.md``)."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "minillm"

# Lowest first: a module may import from its own layer and the layers before it, never after.
LAYERS = [
    ("sampling_params", "metrics", "request", "trace", "workloads"),
    ("kernels",),
    ("attention",),
    ("kv",),
    ("models",),
    ("distributed",),
    ("scheduler", "runner"),
    ("llm_engine",),
    ("engines",),
    ("sim",),
    ("llm",),
    ("capacity",),
    ("server",),
    ("widgets",),
    ("course",),
    ("benchmarks",),
    ("cli", "__init__"),
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The minillm modules ``path`` imports, anywhere in the file (a function-level import is an
    import too): ``from minillm.x import y`` counts as ``minillm.x.y`` when that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [n if n in known else node.module for n in names]
        else:
            continue
        found.update(n for n in names if n.startswith("minillm"))
    return found - {module_name(path)}


def layer(module: str) -> int:
    parts = module.split(".")
    return RANK[parts[1] if len(parts) > 1 else "__init__"]


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: {i for i in imports(path, set(mods)) if i in mods} for name, path in mods.items()}


def test_every_folder_and_top_level_module_has_a_layer():
    tops = {
        module_name(p).split(".")[1] for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE or p.name != "__init__.py"
    }
    assert tops <= set(RANK), f"give these a layer in LAYERS: {sorted(tops - set(RANK))}"


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [
        f"{m} (layer {layer(m)}) imports {i} (layer {layer(i)})"
        for m, deps in graph().items()
        for i in deps
        if layer(i) > layer(m)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    deps = graph()
    # the package's own __init__ files re-export their submodules; a submodule importing a sibling
    # passes through its package's __init__ at run time, but that is Python's doing, not a cycle
    # the code wrote
    state: dict[str, int] = {}
    cycles = []

    def visit(m, path):
        state[m] = 1
        for d in sorted(deps[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d) :] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(deps):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_the_module_map_lists_every_module_once():
    text = (PACKAGE / "README.md").read_text()
    listed = re.findall(r"^\| `([\w/]+\.py)` \|", text, re.M)
    actual = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" or p.parent.name in ("engines", "anchors")
    )
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert sorted(listed) == actual, (
        f"missing from minillm/README.md: {sorted(set(actual) - set(listed))}; "
        f"listed but gone: {sorted(set(listed) - set(actual))}"
    )


def test_no_two_modules_share_a_name():
    """Each name means one thing: ``llm_engine.py`` is the loop and ``engines/`` the engines; the
    simulator's runners are ``sim/twins.py``, not a second ``runner.py``. Widgets and benchmarks are
    named after what they draw or measure (``widgets/capacity.py`` draws ``capacity/``'s results)."""
    seen: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        rel = p.relative_to(PACKAGE)
        if rel.parts[0] in ("widgets", "benchmarks"):
            continue
        name = p.parent.name if p.name == "__init__.py" else p.stem
        if p.name == "__init__.py" and p.parent == PACKAGE:
            continue
        seen.setdefault(name, []).append(str(rel))
    shared = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not shared, shared
