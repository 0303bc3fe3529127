"""A process forked from a rank never speaks for it.

``os.fork()`` copies a rank's whole state into the child: its sockets (shared with the
parent: same connections), its shared-memory mappings, its exit hooks, and the event
loop's objects, but not the loop's thread. Anything the child did with them would act
for the parent: a goodbye to the rendezvous, bytes on a connection, a write to a shared
slot, an ``epoll_ctl`` on the parent's epoll instance, an unlinked segment name.

So, right after a fork, in the child (``os.register_at_fork``):

* every door of the parent is cut off: its session, its loop and the session's methods
  it holds are replaced by stand-ins whose every use raises :class:`DistError`
  ("minidist was initialised in process P; this is a forked child ..."), as CUDA
  refuses a forked child;
* the parent's objects (session, loop, sockets, mappings) are kept, never freed, for the
  child's whole life: no finaliser of theirs runs there (a closing event loop would
  unregister the parent's sockets from the epoll instance they share);
* the sockets among them are closed in the child (only its copies of the descriptors:
  the parent's connections and listening port stay as they were), so that a child that
  outlives its rank does not keep the rank's connections and port open;
* the blocking API forgets the parent's job, so ``minidist.init()`` in the child with a
  rank and world of its own starts afresh.

Nothing here runs in the parent, and nothing is sent anywhere.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import socket
import threading
import types
import weakref
from typing import Any

from .errors import DistError

_tracked: list[tuple[weakref.ref, int]] = []  # (door, pid of the process that made it)
_parent: int | None = None  # in a forked child: the pid whose job it inherited
_kept: list[Any] = []  # the parents' objects, never freed in this process
_SEARCH_LIMIT = 200_000  # objects looked at, at most, for the parent's sockets


def forked_error(parent: int) -> DistError:
    """The error of any minidist call in a child forked from rank process ``parent``."""
    return DistError(
        f"minidist was initialised in process {parent}; this is a forked child "
        f"(pid {os.getpid()}) and cannot use its parent's job: the parent's connections "
        "and shared memory belong to the parent. Call minidist.init() in the child with "
        "a rank and world of its own, or start helper processes with the 'spawn' or "
        "'forkserver' method")


def parent() -> int | None:
    """In a process forked from one that had joined a job: that process's pid (the job it
    cannot use); otherwise None (also after ``init()`` in the child)."""
    return _parent


def joined() -> None:
    """This process joined a job of its own (``init()``): no longer only a forked child."""
    global _parent
    _parent = None


def track(door: Any) -> None:
    """Cut ``door`` off in every child forked from this process from now on."""
    _tracked[:] = [(r, p) for r, p in _tracked if r() is not None]
    _tracked.append((weakref.ref(door), os.getpid()))


def untrack(door: Any) -> None:
    """``door`` is closing: a child forked from now on inherits no job of it."""
    _tracked[:] = [(r, p) for r, p in _tracked if r() is not None and r() is not door]


class _Forked:
    """Stands in for a session or a loop thread in a forked child: every use raises."""

    __slots__ = ("_pid",)

    def __init__(self, pid: int) -> None:
        object.__setattr__(self, "_pid", pid)

    def __getattr__(self, name: str) -> Any:
        raise forked_error(object.__getattribute__(self, "_pid"))

    def __setattr__(self, name: str, value: Any) -> None:
        raise forked_error(self._pid)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise forked_error(object.__getattribute__(self, "_pid"))

    def __repr__(self) -> str:
        return f"<minidist state of process {self._pid}, unusable in forked child>"


def _after_in_child() -> None:
    global _parent
    doors = [(d, pid) for d, pid in ((r(), p) for r, p in _tracked) if d is not None]
    _tracked.clear()
    if not doors:
        return
    owners = {pid for _, pid in doors}
    _parent = max(owners) if len(owners) > 1 else next(iter(owners))
    inherited: list[Any] = []
    for d, pid in doors:
        inherited.append(d.__dict__.copy())
        session, runtime = d.__dict__.get("_session"), d.__dict__.get("runtime")
        d.__dict__["_session"] = _Forked(pid)
        for name, value in list(d.__dict__.items()):
            if isinstance(value, types.MethodType):  # the session's, bound by the door
                d.__dict__[name] = _Forked(pid)
        if runtime is not None:
            d.__dict__["runtime"] = _Forked(pid)
        inherited.extend(x for x in (session, runtime) if x is not None)
        if runtime is not None:  # the loop minidist's own thread ran: walked too
            inherited.append(getattr(getattr(runtime, "loop", None), "__dict__", None))
    _keep(inherited)
    _close_sockets(inherited)


def _keep(objs: list[Any]) -> None:
    """Hold ``objs`` for the rest of this process's life, through interpreter shutdown:
    an extra reference that nothing gives back."""
    _kept.append(objs)
    try:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(objs))
    except (AttributeError, OSError):  # pragma: no cover - no CPython API: module global
        pass


def _close_sockets(roots: list[Any]) -> None:
    """Close this process's copies of the sockets the parent's objects hold. The objects
    are kept (never freed), so none of them closes the descriptor number again."""
    seen: set[int] = set()
    stack = list(roots)
    fds: set[int] = set()
    # modules' namespaces lead to everything the program holds (its own sockets too):
    # never walked (nor listed first: touching every module would copy its pages into
    # the child); a frame is walked through its locals only
    # event loops are not walked either: minidist.aio's is the program's own
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
            threading.Thread, asyncio.AbstractEventLoop)
    while stack and len(seen) < _SEARCH_LIMIT:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, types.FrameType):
            stack.extend(obj.f_locals.values())
            continue
        if isinstance(obj, socket.socket):
            fd = obj.fileno()
            if fd >= 0:
                fds.add(fd)
            continue
        if isinstance(obj, (str, bytes, int, float, bytearray, memoryview)) or (
                type(obj) is dict and "__builtins__" in obj):  # a module's namespace
            continue
        stack.extend(gc.get_referents(obj))
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_after_in_child)
