"""Work handles for torch code: ``wait()``, ``is_completed()`` and a torch Future.

:class:`Work` is a subclass of torch's own Work (``torch.distributed._Work``), so the
same object serves ``async_op=True`` of the drop-in module and every call of the
registered backend: torch calls its ``wait()`` (which raises the call's minidist error)
from Python for synchronous calls and from C++ for functional collectives, and its
``get_future()`` from DDP's reducer (a Future that carries the error).

A call of the adapter may be several minidist calls (an all_to_all with uneven splits is
one message per peer) followed by a step that runs in Python once they are done (copy a
scratch tensor back into a non-contiguous output, round float32 back to bfloat16). A
:class:`Work` runs that step exactly once, in whichever thread first sees the call done:

* ``wait()`` and ``is_completed()`` run it in the caller's thread;
* ``get_future()`` (what DDP and ``torch.futures`` users rely on) runs it in one daemon
  thread of this process, the completer, which then completes the torch Future. Torch
  callbacks chained on that Future therefore never run on minidist's I/O thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import datetime
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..errors import DistTimeoutError

#: torch's Work class (``torch.distributed._Work``), which Python subclasses may extend
TorchWork = torch._C._distributed_c10d.Work

_queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def _completer_loop() -> None:
    while True:
        job = _queue.get()
        try:
            job()
        except BaseException:  # a job completes its own Future; nothing else to tell
            pass


def _schedule(job: Callable[[], None]) -> None:
    global _thread
    if _thread is None:
        with _thread_lock:
            if _thread is None:
                _thread = threading.Thread(target=_completer_loop, daemon=True,
                                           name="minidist-torch-completer")
                _thread.start()
    _queue.put(job)


def in_completer() -> bool:
    """True on the completer thread (a torch Future callback is running)."""
    return _thread is not None and threading.current_thread() is _thread


def _after_fork() -> None:
    global _thread, _queue
    _thread = None
    _queue = queue.SimpleQueue()


os.register_at_fork(after_in_child=_after_fork)


def _error_of(f: concurrent.futures.Future) -> BaseException | None:
    """The error of a finished future (a cancelled one counts as failed)."""
    if f.cancelled():
        return concurrent.futures.CancelledError("the call was cancelled (minidist was "
                                                 "shut down while it ran)")
    return f.exception()


def torch_worded(error: BaseException | None) -> BaseException | None:
    """``error`` as torch code reads it. A timeout says "Timed out" the way torch's
    backends do (``[minidist] Timed out waiting for barrier: ...``; code and tests
    written for gloo and NCCL look for those words): the same exception class and
    attributes, with that prefix on the message. Other errors are left alone."""
    if not isinstance(error, DistTimeoutError) or not error.args:
        return error
    message = str(error.args[0])
    if message.startswith(_PREFIX):
        return error
    worded = copy.copy(error)
    what = error.collective or "the call"
    worded.args = (f"{_PREFIX}Timed out waiting for {what}: {message}", *error.args[1:])
    worded.__cause__ = error.__cause__
    return worded.with_traceback(error.__traceback__)


_PREFIX = "[minidist] "


def seconds(timeout: Any) -> float | None:
    """A timeout as seconds: None (no timeout given), a number, or a timedelta.

    0 means "do not wait": a call that cannot complete at once times out. A negative
    timeout raises ValueError.
    """
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool):
        raise TypeError(f"timeout must be seconds or a timedelta, not {timeout!r}")
    timeout = float(timeout)
    if not timeout >= 0:  # negative, or NaN
        raise ValueError(f"timeout must be >= 0 seconds, not {timeout!r}")
    return timeout


class Work(TorchWork):
    """An adapter call in flight (what ``async_op=True`` returns): a torch Work."""

    def __init__(self, futures: list[concurrent.futures.Future], post: Callable[[], None]
                 | None = None, result: Any = None, what: str = "call",
                 source_rank: int | Callable[[], int] = -1,
                 group_ranks: tuple[int, ...] | None = None,
                 devices: list[torch.device] | None = None) -> None:
        super().__init__()
        self._devices = devices  # CUDA devices of the outputs (for the torch Future)
        self.futures = futures  #: the minidist calls this Work waits for
        self._post = post
        self.outputs = result  #: what :meth:`result` returns (the output tensors)
        self._what = what
        self._src = source_rank  # a receive's sender: a global rank, or a callable
        self._src_ranks = group_ranks  # the receive's group (global ranks, in order)
        self._lock = threading.Lock()
        self._finished = False
        self._error: BaseException | None = None
        self._done: torch.futures.Future | None = None  # completed when the call is
        self._tfut: torch.Future | None = None  # what get_future() returns
        #: seconds a plain ``wait()`` may take (a per-call timeout; None: no extra bound)
        self.limit: float | None = None

    # ------------------------------------------------------------------ completion

    def _all_done(self) -> bool:
        return all(f.done() for f in self.futures)

    def finish(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` seconds; None: no bound of its own) for the minidist
        calls, run the final step once; raise the call's error (DistTimeoutError if the
        calls are not done in time; they keep running)."""
        if not self._finished:
            if not self.futures:
                done, pending = set(), set()
            elif len(self.futures) == 1:  # the usual case, without wait()'s waiters
                f = self.futures[0]
                with contextlib.suppress(concurrent.futures.TimeoutError,
                                         concurrent.futures.CancelledError):
                    f.exception(timeout)  # waits; the error itself is read below
                done, pending = ({f}, set()) if f.done() else (set(), {f})
            else:
                done, pending = concurrent.futures.wait(
                    self.futures, timeout, return_when=concurrent.futures.FIRST_EXCEPTION)
            failed = next((f for f in done if _error_of(f) is not None), None)
            if failed is None and pending:
                raise DistTimeoutError(f"{_PREFIX}Timed out waiting {timeout * 1000:.0f}ms "
                                       f"for {self._what} (not done within {timeout:g} s; "
                                       "the call itself keeps running)",
                                       collective=self._what)
            with self._lock:
                if not self._finished:
                    if failed is not None:
                        self._error = torch_worded(_error_of(failed))
                    elif self._post is not None:
                        try:
                            self._post()
                        except BaseException as e:
                            self._error = e
                    self._post = None
                    self._finished = True
        if self._error is not None:
            raise self._error

    def _complete_future(self) -> None:
        """On the completer: finish, then complete the torch Future."""
        try:
            self.finish()
        except BaseException:
            pass  # kept in self._error: _outcome raises it into the torch Future
        if not self._done.done():
            self._done.set_result(None)

    def _outcome(self, _done: torch.Future) -> Any:
        """The torch Future's value: the outputs, or the call's error raised (so that
        torch marks the Future as failed, which C++ consumers such as DDP's reducer see;
        an exception passed to ``set_exception`` would look like a result to them)."""
        if self._error is not None:
            raise self._error
        return self.outputs

    def _arm(self) -> None:
        remaining = [len(self.futures)]
        lock = threading.Lock()

        def one_done(f: concurrent.futures.Future) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last or _error_of(f) is not None:
                _schedule(self._complete_future)

        if not self.futures:
            _schedule(self._complete_future)
        for f in self.futures:
            f.add_done_callback(one_done)

    # ------------------------------------------------------------------ torch's Work API

    def wait(self, timeout: Any = None) -> bool:
        """Block until the call is done (its outputs written); raise its error (the
        minidist exception: PeerLostError, DistTimeoutError, CollectiveMismatchError...).

        ``timeout`` (seconds or a timedelta) bounds only this wait: DistTimeoutError
        when it passes first; the call itself keeps running. None or 0 (torch's
        ``timedelta(0)``, "no timeout", which torch itself passes) add no bound of their
        own: the call still ends within its group's timeout. Returns True, like torch.
        """
        t = seconds(timeout)
        self.finish(self.limit if not t else t)
        return True

    def is_completed(self) -> bool:
        """True once the call finished, successfully or not (never blocks)."""
        if self._finished:
            return True
        if not self._all_done():
            return False
        try:
            self.finish()
        except BaseException:
            pass
        return True

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error if self.is_completed() else None

    def result(self) -> Any:
        """The output tensors, once done (like torch's ``Work.result()``)."""
        self.wait()
        return self.outputs

    def source_rank(self) -> int:
        """The global rank a receive came from. For a receive from any source, known
        once the receive is done: this waits for it (and raises its error)."""
        if callable(self._src):
            self.wait()
            return self._src()
        return self._src

    def _source_rank(self) -> int:
        """torch's: the rank a receive came from, counted in the receive's group (what
        ``torch.distributed.recv(src=None)`` and ``irecv(...)._source_rank()`` read)."""
        src = self.source_rank()
        if self._src_ranks is None or src < 0:
            return src
        return self._src_ranks.index(src)

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.Future:
        """A ``torch.Future`` completed with the output tensors when the call is done,
        or failed with its error. torch Futures carry errors as text: ``wait()`` and
        ``value()`` on it raise a RuntimeError whose message names the minidist error
        (``Work.wait()`` raises the minidist exception itself)."""
        inline = False
        with self._lock:
            if self._tfut is None:
                self._done = (torch.futures.Future(devices=self._devices)
                              if self._devices else torch.futures.Future())
                self._tfut = self._done.then(self._outcome)
                inline = in_completer()  # a callback waits inline: never on itself
                if not inline:
                    self._arm()
        if inline:
            self._complete_future()
        return self._tfut

    def __repr__(self) -> str:
        state = "done" if self._finished or self._all_done() else "pending"
        return f"<minidist.torch.Work {self._what} {state}>"


class Blocking:
    """A synchronous call through the shared-memory fast path, run by ``wait()`` on the
    caller's thread (outside the lock under which calls are numbered; its turn among
    the group's calls is kept by its number). Only the drop-in module's synchronous
    calls make one, and wait for it at once: it is never handed to torch."""

    __slots__ = ("_door", "_item", "_post")

    def __init__(self, door: Any, item: Any, post: Callable[[], None] | None) -> None:
        self._door = door
        self._item = item
        self._post = post

    def wait(self, timeout: Any = None) -> bool:
        """Run the call; raise its error as :meth:`Work.wait` would."""
        run_blocking(self._door, self._item)
        if self._post is not None:
            self._post()
        return True


def run_blocking(door: Any, item: Any) -> None:
    """Run a prepared call on this thread to its end; its error raises here, worded as
    :meth:`Work.wait` words it."""
    try:
        door.wait(item)
    except DistTimeoutError as e:
        raise torch_worded(e) from e.__cause__


class Done:
    """What a synchronous call that already ran returns: waiting for it is free."""

    __slots__ = ()

    def wait(self, timeout: Any = None) -> bool:
        return True


DONE = Done()


def together(works: list[Work], result: Any, what: str) -> Work:
    """One Work for ``works`` (torch's coalesced calls): done once all of them are, its
    final step theirs (in order), its error the first of theirs, its result ``result``."""
    futures = [f for w in works for f in w.futures]

    def post() -> None:
        for w in works:
            w.finish()

    return Work(futures, post, result, what)


def done_work(result: Any = None, what: str = "call") -> Work:
    """A Work that is already complete (nothing had to be communicated)."""
    return Work([], None, result, what)
