"""Algorithms of your own, from a module: what ``MINIDIST_ALGO_MODULE`` and the
``module:function`` names of ``minidist algo`` and ``minidist bench`` load.

:func:`load_module` imports a module (from ``sys.path``, then the current directory)
and makes its algorithms usable by name: those it registers itself with
:func:`minidist.algorithms.register` when imported, and every public function defined
in it that returns a :class:`Schedule` when called as ``fn(rank, size, count, root)``,
registered under the function's own name for the collective its schedules say.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Iterable

from .registry import (
    ALGORITHMS,
    COLLECTIVES,
    algorithm_function,
    builtin,
    collective_algorithms,
    register,
    unwrap,
)
from .schedule import Schedule

__all__ = ["load_module", "load_modules", "resolve"]

_PROBES = ((0, 2, 4), (1, 4, 8), (0, 1, 1), (0, 3, 7))


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if not (name == missing or name.startswith(missing + ".")) or "" in sys.path:
            raise
    sys.path.append("")  # like python -m: the current directory
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove("")


def _annotated_schedule(fn: Callable) -> bool | None:
    """True if ``fn`` says it returns a Schedule, False if it says something else,
    None if it says nothing."""
    ret = inspect.signature(fn).return_annotation
    if ret is inspect.Signature.empty:
        return None
    return ret is Schedule or (isinstance(ret, str) and ret.split(".")[-1] == "Schedule")


def _probe(fn: Callable) -> tuple[Schedule | None, Exception | None]:
    """Call ``fn`` with a few small groups; the first Schedule it returns."""
    error = None
    for rank, size, count in _PROBES:
        try:
            s = fn(rank, size, count, 0)
        except Exception as e:  # noqa: BLE001 - any function: we only look
            error = error or e
            continue
        if isinstance(s, Schedule):
            return s, None
        return None, None
    return None, error


def load_module(name: str) -> list[tuple[str, str]]:
    """Import module ``name`` and register its algorithms; returns the
    ``(collective, algorithm)`` pairs it made usable (or had made usable before).

    A function counts as an algorithm when it is defined in the module, its name does
    not start with ``_``, it takes ``(rank, size, count, root)`` and it returns a
    Schedule (probed with a few small groups); it is registered under its own name for
    the collective its schedule names. Functions the module registered itself are not
    registered again. Loading a module twice is harmless.

    ImportError when the module cannot be imported (its own error chained); ValueError
    when a function annotated ``-> Schedule`` fails to build a schedule, or when a
    function's name is a built-in algorithm's.
    """

    try:
        module = _import(name)
    except Exception as e:
        raise ImportError(f"cannot import algorithm module {name!r}: "
                          f"{type(e).__name__}: {e}") from e
    before = {c: set(names) for c, names in ALGORITHMS.items()}
    known = {id(unwrap(fn)) for c in COLLECTIVES
             for fn in collective_algorithms(c).values()}
    for attr, obj in list(vars(module).items()):
        if (attr.startswith("_") or not inspect.isfunction(obj)
                or obj.__module__ != module.__name__ or id(obj) in known):
            continue
        try:
            inspect.signature(obj).bind(0, 1, 1, 0)
        except (TypeError, ValueError):
            continue
        annotated = _annotated_schedule(obj)
        if annotated is False:
            continue
        schedule, error = _probe(obj)
        if schedule is None:
            if annotated and error is not None:
                raise ValueError(f"{name}.{attr} says it returns a Schedule but raised "
                                 f"{type(error).__name__}: {error} when called as "
                                 f"{attr}(rank, size, count, root)") from error
            continue
        collective = schedule.collective
        if collective not in ALGORITHMS:
            raise ValueError(f"{name}.{attr} returns a schedule for {collective!r}, which is "
                             "not a collective")
        if attr in builtin(collective):
            raise ValueError(f"{name}.{attr}: {attr!r} is the name of a built-in "
                             f"{collective} algorithm; rename the function, or register it "
                             "under another name with minidist.algorithms.register()")
        register(collective, attr, obj)
    return [(c, a) for c, names in ALGORITHMS.items() for a in names
            if a not in builtin(c) and (a not in before[c] or getattr(
                unwrap(collective_algorithms(c)[a]), "__module__", None) == module.__name__)]


def load_modules(names: Iterable[str]) -> list[tuple[str, str]]:
    """:func:`load_module` for each name (``MINIDIST_ALGO_MODULE`` may list several,
    separated by commas)."""
    out: list[tuple[str, str]] = []
    for name in names:
        for pair in load_module(name):
            if pair not in out:
                out.append(pair)
    return out


def resolve(collective: str, spec: str | Callable) -> str:
    """The registered name for ``spec``: a name as it is, or ``"module:function"``
    (the module loaded with :func:`load_module`; the function registered under its own
    name for ``collective`` if the module did not register it). ValueError if the
    module has no such function or it is not known for ``collective``."""

    if callable(spec):
        fn, module_name, attr = spec, getattr(spec, "__module__", "?"), spec.__name__
    elif ":" in spec:
        module_name, _, attr = spec.partition(":")
        load_module(module_name)
        module = sys.modules[module_name]
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise ValueError(f"module {module_name!r} has no function {attr!r}")
    else:
        if spec not in ALGORITHMS.get(collective, ()):
            algorithm_function(collective, spec)  # raises, listing the known ones
        return spec
    for name, registered in (collective_algorithms(collective).items()
                             if collective in ALGORITHMS else ()):
        if unwrap(registered) is fn:
            return name
    for c, algos in ((c, collective_algorithms(c)) for c in COLLECTIVES):
        if c != collective and any(unwrap(f) is fn for f in algos.values()):
            raise ValueError(f"{module_name}:{attr} is a {c} algorithm, not a {collective} "
                             "one")
    register(collective, attr, fn)
    return attr
