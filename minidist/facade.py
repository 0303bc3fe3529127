"""The user functions of the collectives whose records carry a front end
(:class:`minidist.collectives.FrontEnd`): their definitions (:class:`minidist.calls.Call`)
for the blocking API and :mod:`minidist.aio`, and :func:`define` for
:mod:`minidist.torch`. Each is a real function with the signature
``(array, op=ReduceOp.SUM, group=None, async_op=False, algorithm=None, *, <flag>=False)``,
compiled once at import (no binding of arguments per call). Pure: no I/O."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import calls, collectives
from .collectives import Collective
from .ops import ReduceOp


def params(rec: Collective, first: str = "array", annotation: str = "np.ndarray",
           algorithm: bool = True) -> str:
    """The parameter list of ``rec``'s function, as source text."""
    text = (f"{first}: {annotation}, op: ReduceOp = ReduceOp.SUM, group: Group | None = None, "
            "async_op: bool = False")
    if algorithm:
        text += ", algorithm: str | None = None"
    if rec.front.flag:
        text += f", *, {rec.front.flag}: bool = False"
    return text


def chosen(rec: Collective) -> str:
    """The expression that names the collective a call runs: ``rec``'s, or its flagged
    one when the flag is true."""
    front = rec.front
    if front.flag:
        return f"{front.flagged!r} if {front.flag} else {rec.name!r}"
    return repr(rec.name)


def definition(rec: Collective) -> calls.Call:
    """The definition of ``rec``'s function in the blocking API and minidist.aio, planned
    by the one generic ``Planner.prepare_collective``."""
    return calls.Call(rec.front.function, params(rec), calls.COLLECTIVE, "{handle} | None",
                      rec.front.doc,
                      f"d.plan.prepare_collective({chosen(rec)}, array, op, group, algorithm)",
                      aio_doc=rec.front.doc)


def definitions() -> list[calls.Call]:
    """The definitions of every collective with a front end."""
    return [definition(rec) for rec in records()]


def define(rec: Collective, body: Callable[..., Any], module: str, *,
           first: str = "array", annotation: Any = "np.ndarray",
           returns: Any = "Work | None", algorithm: bool = True) -> Callable[..., Any]:
    """The function ``module.<function>`` of ``rec``: it calls ``body(name, first, op,
    group, async_op, algorithm)`` with the collective it names (``body`` may be a
    coroutine function: then so is the result)."""
    is_async = inspect.iscoroutinefunction(body)
    head = "async def" if is_async else "def"
    wait = "await " if is_async else ""
    algo = "algorithm" if algorithm else "None"
    source = (f"from __future__ import annotations\n"
              f"{head} {rec.front.function}({params(rec, first, annotation, algorithm)}) "
              f"-> {returns}:\n"
              f"    return {wait}body({chosen(rec)}, {first}, op, group, async_op, {algo})\n")
    namespace: dict[str, Any] = {"body": body, "ReduceOp": ReduceOp, "__name__": module}
    made: dict[str, Any] = {}
    exec(compile(source, f"<{module}.{rec.front.function}>", "exec", dont_inherit=True),  # noqa: S102
         namespace, made)
    call = made[rec.front.function]
    call.__doc__ = rec.front.doc
    return call


def records() -> list[Collective]:
    """The collectives with generated front ends."""
    return collectives.front_ends()
