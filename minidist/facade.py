"""The user functions of the collectives whose records carry a front end
(:class:`minidist.collectives.FrontEnd`): one definition of each one's signature and
checks, from which the blocking API, :mod:`minidist.aio` and :mod:`minidist.torch` make
theirs. Pure: no I/O."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import collectives
from .collectives import Collective
from .ops import ReduceOp

_P = inspect.Parameter


def signature(rec: Collective, first: str = "array", annotation: Any = "np.ndarray",
              returns: Any = "Work | None", algorithm: bool = True) -> inspect.Signature:
    """``(array, op=ReduceOp.SUM, group=None, async_op=False, algorithm=None, <flag>=False)``."""
    front = rec.front
    params = [_P(first, _P.POSITIONAL_OR_KEYWORD, annotation=annotation),
              _P("op", _P.POSITIONAL_OR_KEYWORD, default=ReduceOp.SUM, annotation="ReduceOp"),
              _P("group", _P.POSITIONAL_OR_KEYWORD, default=None, annotation="Group | None"),
              _P("async_op", _P.POSITIONAL_OR_KEYWORD, default=False, annotation="bool")]
    if algorithm:
        params.append(_P("algorithm", _P.POSITIONAL_OR_KEYWORD, default=None,
                         annotation="str | None"))
    if front.flag:
        params.append(_P(front.flag, _P.KEYWORD_ONLY, default=False, annotation="bool"))
    return inspect.Signature(params, return_annotation=returns)


def chosen(rec: Collective, flags: dict[str, Any]) -> str:
    """The collective a call names: ``rec``'s, or its flagged one when the flag is true.
    TypeError for an unknown keyword (as Python says it)."""
    front = rec.front
    extra = set(flags) - ({front.flag} if front.flag else set())
    if extra:
        raise TypeError(f"{front.function}() got an unexpected keyword argument "
                        f"{sorted(extra)[0]!r}")
    if front.flag and flags.get(front.flag):
        return front.flagged
    return rec.name


def define(rec: Collective, body: Callable[..., Any], module: str, *,
           first: str = "array", annotation: Any = "np.ndarray",
           returns: Any = "Work | None", algorithm: bool = True) -> Callable[..., Any]:
    """The function ``module.<function>`` of ``rec``: it checks its keywords, then calls
    ``body(name, first, op, group, async_op, algorithm)`` with the collective it names
    (``body`` may be a coroutine function: then so is the result)."""
    front = rec.front
    sig = signature(rec, first, annotation, returns, algorithm)

    def bind(args: tuple, kwargs: dict) -> tuple:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        name = chosen(rec, {front.flag: a[front.flag]} if front.flag else {})
        return (name, a[first], a["op"], a["group"], a["async_op"], a.get("algorithm"))

    if inspect.iscoroutinefunction(body):
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await body(*bind(args, kwargs))
    else:
        def call(*args: Any, **kwargs: Any) -> Any:
            return body(*bind(args, kwargs))
    call.__name__ = call.__qualname__ = front.function
    call.__module__ = module
    call.__doc__ = front.doc
    call.__signature__ = sig  # type: ignore[attr-defined]
    return call


def records() -> list[Collective]:
    """The collectives with generated front ends."""
    return collectives.front_ends()
