"""A griffe extension for the API reference: minidist's user functions are made when
their modules are imported (from their definitions in minidist.calls), so reading a
module's file does not find them, or finds a hand-written one without its docstring.
This reads the source that each module's functions were made from (as the file's own
functions are read: signatures as written) and gives them their docstrings."""

from __future__ import annotations

import importlib
import inspect
import linecache
import sys
from typing import Any

import griffe

MODULES = ("api", "aio", "elastic_api")


class MadeFunctions(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        if pkg.name != "minidist":
            return
        root = str(pkg.filepath.parent.parent)  # minidist/__init__.py
        sys.path.insert(0, root)
        try:
            for name in MODULES:
                _add(pkg[name], importlib.import_module(f"minidist.{name}"), loader)
        finally:
            sys.path.remove(root)


def _add(read: griffe.Module, live: Any, loader: griffe.GriffeLoader) -> None:
    sources = {f.__code__.co_filename for f in vars(live).values()
               if inspect.isfunction(f) and f.__module__ == live.__name__
               and f.__code__.co_filename.startswith("<")}
    for filename in sorted(sources):
        made = griffe.visit(read.path, filepath=read.filepath,
                            code="".join(linecache.getlines(filename)))
        for name, f in made.members.items():
            if f.is_alias or not f.is_function:
                continue
            doc = getattr(live, name).__doc__
            written = read.members.get(name)
            if written is None:
                read.set_member(name, f)
            elif written.docstring is not None:
                continue
            target = written or f
            target.docstring = griffe.Docstring(
                inspect.cleandoc(doc), parent=target, parser=loader.docstring_parser,
                parser_options=loader.docstring_options)
