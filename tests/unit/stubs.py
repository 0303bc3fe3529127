"""The type stubs (``.pyi``) of the modules whose user functions are made at import from
their one definition (:mod:`minidist.calls`): type checkers and editors read a module's
source without running it, so they would not see those functions.

A stub is the module's own source with every body cut to ``...`` and every statement
that only runs (``calls.make(...)``, ``if``, ``try``) left out, followed by the made
functions' signatures from their definitions. ``tests/unit/test_calls.py`` checks that
the stubs in the package are these; after changing a definition, write them again:

    python -m tests.unit.stubs
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path
from types import ModuleType

from minidist import calls, facade

MODULES = {"minidist.api": "Work", "minidist.aio": "Handle", "minidist.elastic_api": "Work"}
HEADER = ('"""Type stubs of {module}, written by ``python -m tests.unit.stubs`` from the '
          "module and\nthe definitions of its made functions (minidist.calls): do not edit."
          '"""\n\n')


def _bodiless(node: ast.AST) -> ast.AST:
    """``node`` (a function or class) with every body cut to ``...``; an import names
    what it imports again (``import x as x``): a stub re-exports only those, and the
    module has them."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            if alias.asname is None and "." not in alias.name:
                alias.asname = alias.name
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node.body = [ast.Expr(ast.Constant(...))]
    elif isinstance(node, ast.ClassDef):
        node.body = [_bodiless(n) for n in node.body if _kept(n)] or [ast.Expr(ast.Constant(...))]
    elif isinstance(node, ast.Assign) and not isinstance(
            node.value, (ast.Name, ast.Attribute, ast.BinOp, ast.Subscript, ast.List,
                         ast.Tuple, ast.Constant)):
        node.value = ast.Constant(...)
    elif isinstance(node, ast.AnnAssign):
        node.value = None
        node.simple = 1
    return node


def _kept(node: ast.AST) -> bool:
    """Whether a statement declares something (not one that only runs)."""
    return isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                             ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign))


def stub(name: str) -> str:
    """The stub text of module ``name``."""
    module: ModuleType = importlib.import_module(name)
    tree = ast.parse(Path(module.__file__).read_text())
    written = {n.name for n in tree.body
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    body = [_bodiless(n) for n in tree.body if _kept(n)]
    text = HEADER.format(module=name) + ast.unparse(ast.Module(body, [])) + "\n"
    definitions = {**calls.CALLS, **{c.name: c for c in facade.definitions()}}
    made = [(n, fn) for n, fn in vars(module).items()
            if inspect.isfunction(fn) and fn.__module__ == name and n not in written]
    for n, fn in made:
        line = calls.stub(definitions[n], MODULES[name]).replace("\n    pass\n", " ...\n")
        text += "\n" + ("async " if inspect.iscoroutinefunction(fn) else "") + line
    return text


def path(name: str) -> Path:
    return Path(importlib.import_module(name).__file__).with_suffix(".pyi")


if __name__ == "__main__":
    for name in MODULES:
        path(name).write_text(stub(name))
        print("wrote", path(name), file=sys.stderr)
