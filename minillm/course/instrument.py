"""Give one of minillm's functions a first line that reports it ran, for the grader's runtime check.

``minillm.course.runtime_check`` must know when minillm's answer to an exercise runs in the
learner's process, by any route: an import inside a function, ``sys.modules``, ``pickle``, an
inherited method, ``gc.get_objects()``... All of them end at the same function object, so the
report goes into that object's code: the function is recompiled from its own source with one call
added before its first statement, and the new code replaces ``__code__`` in place. Everything else
is kept: the file, the qualified name, the line numbers of its statements, its closure. The call
is a constant of the code itself (not a global name a learner's code could rebind), and nothing
else runs slower: the rest of minillm is untouched.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
import warnings

PLACEHOLDER = "minillm.course.instrument: the report"  # compiled as a call, then swapped for the report


def instrument(fn: types.FunctionType, report) -> None:
    """Make ``fn`` call ``report()`` first whenever it runs. ValueError when its source cannot be
    read or recompiled to the same shape (a function made at run time, say)."""
    code = fn.__code__
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError) as err:
        raise ValueError(f"cannot read the source of {code.co_qualname}: {err}") from None
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, first - 1)  # the lines of the file
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name != code.co_name:
        raise ValueError(f"the source of {code.co_qualname} is not its def")
    node.decorator_list = []  # the decorated object is not recompiled, only the function under it
    call = ast.Expr(ast.Call(ast.Constant(PLACEHOLDER), [], []))
    node.body.insert(0, ast.copy_location(call, node.body[0]))
    body: list[ast.stmt] = [node]
    if "__class__" in code.co_freevars:  # super() or __class__: it is compiled inside a class, as it was
        body = [ast.ClassDef("Holder", [], [], body, [])]
    others = [name for name in code.co_freevars if name != "__class__"]
    if others:  # a closure: its free variables are the enclosing function's locals
        assign = [ast.parse(f"{name} = None").body[0] for name in others]
        body = [ast.FunctionDef("holder", ast.arguments([], [], None, [], [], None, []), assign + body, [], None)]
    module = ast.fix_missing_locations(ast.Module(body, []))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # "'str' object is not callable": it will be
        compiled = compile(module, code.co_filename, "exec", dont_inherit=True)
    (new,) = [c for c in nested_codes(compiled) if c.co_name == code.co_name and PLACEHOLDER in c.co_consts]
    new = new.replace(
        co_qualname=code.co_qualname,
        co_consts=tuple(report if isinstance(c, str) and c == PLACEHOLDER else c for c in new.co_consts),
    )
    if (
        new.co_freevars != code.co_freevars
        or new.co_varnames[: code.co_argcount] != code.co_varnames[: code.co_argcount]
    ):
        raise ValueError(f"{code.co_qualname} recompiled to another shape")
    fn.__code__ = new


def nested_codes(code) -> list:
    """``code`` and every code object inside it (the functions, classes and comprehensions it defines)."""
    out, todo = [], [code]
    while todo:
        code = todo.pop()
        out.append(code)
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return out
