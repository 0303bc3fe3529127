"""This process's place in minidist: the doors its front ends use, and how it got them.

A process joins a job through one front end: the blocking API (``minidist.init``; the
torch adapter is built on it and joins the same way) or :mod:`minidist.aio` (on the
program's own loop), never both at once. An embedding runtime (:mod:`minidist.ray`) may
hold doors of jobs of its own beside it, one per job. :data:`STATE` holds all of them,
and every front end goes through its one logic: joining (refused, before anything
starts, while the process is in a job of that kind or the other), leaving (after which
it may join again), the error a call gets when the process has not joined, and what a
child forked from the process forgets (see :mod:`minidist.forkguard`).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from . import forkguard
from .errors import DistError

if TYPE_CHECKING:
    from .door import Door


class ProcessState:
    """The doors of this process and the lock under which the blocking ones change.

    ``blocking``: the door of the blocking API (a loop in a background thread), None
    when it has not joined. ``aio``: the door of :mod:`minidist.aio` (the program's own
    loop). ``jobs``: the jobs an embedding runtime joined, each holding a door of its
    own (:mod:`minidist.ray`). ``lock``: held while the process joins or leaves through
    the blocking API or an embedding runtime, so that those happen one at a time.
    ``crashed``: an uncaught error is ending the program (the blocking door then leaves
    without waiting for the others, which hear this rank is lost)."""

    __slots__ = ("blocking", "aio", "jobs", "lock", "crashed", "_hooked")

    def __init__(self) -> None:
        self.blocking: Door | None = None
        self.aio: Door | None = None
        self.jobs: list[Any] = []
        self.lock = threading.RLock()
        self.crashed = False
        self._hooked = False  # the exit hooks are in place (a forked child keeps them)

    # ------------------------------------------------------------------ the doors

    def door(self) -> Door:
        """This process's door for blocking callers (see :mod:`minidist.door`): how the
        blocking API and the layers built on it (``minidist.torch``) plan and start
        calls. DistError if the process has not joined through the blocking API."""
        d = self.blocking  # (every blocking call reads it: one attribute, nothing more)
        if d is None:
            raise self._not_joined(blocking=True)
        return d

    def aio_door(self) -> Door:
        """This process's door for :mod:`minidist.aio`; DistError if it has not joined
        through it."""
        d = self.aio
        if d is None:
            raise self._not_joined(blocking=False)
        return d

    def _not_joined(self, blocking: bool) -> DistError:
        """Why a front end has no door: a forked child, the other front end, or no job."""
        parent = forkguard.parent()
        if parent is not None:
            return forkguard.forked_error(parent)
        if blocking:
            if self.aio is not None:
                return DistError("this process uses minidist.aio (await minidist.aio.init()); "
                                 "await minidist.aio's functions instead of the blocking API")
            if "minidist.torch" in sys.modules:
                return DistError("minidist is not initialized: call init_process_group() (or "
                                 "minidist.init()) first")
            return DistError("minidist is not initialized: call minidist.init() first")
        if self.blocking is not None:
            return DistError("this process uses the blocking API (minidist.init()); call "
                             "minidist's functions, not minidist.aio's")
        return DistError("minidist.aio is not initialized: await minidist.aio.init() first")

    # ------------------------------------------------------------------ joining

    def _refuse_second(self, blocking: bool) -> None:
        """DistError if the process is in a job already, through either front end."""
        if blocking and self.blocking is not None:
            raise DistError("minidist is already initialized; call minidist.destroy() first")
        if blocking and self.aio is not None:
            raise DistError("this process already uses minidist.aio (await "
                            "minidist.aio.init()); await minidist.aio.destroy() first")
        if not blocking and self.aio is not None:
            raise DistError("minidist.aio is already initialized")
        if not blocking and self.blocking is not None:
            raise DistError("this process already uses the blocking API (minidist.init())")

    def join(self, start: Callable[[], Door]) -> Door:
        """Join through the blocking API: ``start()`` opens the door (joining the job),
        which becomes this process's blocking door. One join at a time; DistError,
        before ``start`` runs, if the process is in a job already."""
        with self.lock:
            self._refuse_second(blocking=True)
            d = start()
            self.blocking = d
            self._hook_exit()
            forkguard.joined()
        return d

    async def join_aio(self, start: Callable[[], Awaitable[Door]]) -> Door:
        """Join through :mod:`minidist.aio`: ``await start()`` opens the door on the
        running loop. DistError, before ``start`` runs, if the process is in a job
        already."""
        self._refuse_second(blocking=False)
        d = await start()
        self.aio = d
        forkguard.joined()
        return d

    def _hook_exit(self) -> None:
        """Once per process: leave at exit, and remember an uncaught error first."""
        if self._hooked:
            return
        self._hooked = True
        previous = sys.excepthook

        def excepthook(*args: Any) -> None:
            self.crashed = True  # the others must hear this rank is lost
            previous(*args)

        sys.excepthook = excepthook
        atexit.register(self.leave)

    # ------------------------------------------------------------------ leaving

    def leave(self) -> None:
        """Leave the blocking API's job and release its sockets and thread (nothing if
        the process is not in one); the process may join again afterwards."""
        with self.lock:
            d, self.blocking = self.blocking, None
        if d is not None:
            d.leave(graceful=not self.crashed)

    async def leave_aio(self) -> None:
        """Leave :mod:`minidist.aio`'s job (nothing if not in one); it may join again."""
        d, self.aio = self.aio, None
        if d is not None:
            await d.close()

    def forget(self) -> None:
        """In a forked child: the parent's jobs are not the child's (its doors are cut
        off by :mod:`minidist.forkguard`); it may join one of its own. The lock may have
        been held by another thread of the parent."""
        self.blocking = self.aio = None
        self.jobs = []
        self.lock = threading.RLock()
        self.crashed = False


STATE = ProcessState()
"""The one state of this process (never replaced: front ends bind its methods once)."""

os.register_at_fork(after_in_child=STATE.forget)
