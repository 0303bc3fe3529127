"""Work handles for torch code: ``wait()``, ``is_completed()`` and a torch Future.

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
import datetime
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..errors import DistTimeoutError

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


def seconds(timeout: Any) -> float | None:
    """A timeout as seconds: None, a number, or a timedelta (0 or less: no limit, as
    torch's ``kNoTimeout``)."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    timeout = float(timeout)
    return timeout if timeout > 0 else None


class Work:
    """An adapter call in flight (what ``async_op=True`` returns), like torch's Work."""

    def __init__(self, futures: list[concurrent.futures.Future], post: Callable[[], None]
                 | None = None, result: Any = None, what: str = "call",
                 source_rank: int = -1) -> None:
        self._futures = futures
        self._post = post
        self._result = result
        self._what = what
        self._src = source_rank
        self._lock = threading.Lock()
        self._finished = False
        self._error: BaseException | None = None
        self._tfut: torch.futures.Future | None = None

    # ------------------------------------------------------------------ completion

    def _all_done(self) -> bool:
        return all(f.done() for f in self._futures)

    def _finish(self, timeout: float | None = None) -> None:
        """Wait for the minidist calls, run the final step once; raise the call's error."""
        if not self._finished:
            if len(self._futures) == 1:  # the usual case, without wait()'s waiters
                f = self._futures[0]
                with contextlib.suppress(concurrent.futures.TimeoutError,
                                         concurrent.futures.CancelledError):
                    f.exception(timeout)  # waits; the error itself is read below
                done, pending = ({f}, set()) if f.done() else (set(), {f})
            else:
                done, pending = concurrent.futures.wait(
                    self._futures, timeout, return_when=concurrent.futures.FIRST_EXCEPTION)
            failed = next((f for f in done if _error_of(f) is not None), None)
            if failed is None and pending:
                raise DistTimeoutError(f"{self._what}: not done within {timeout:g} s "
                                       "(the call itself keeps running)",
                                       collective=self._what)
            with self._lock:
                if not self._finished:
                    if failed is not None:
                        self._error = _error_of(failed)
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
        """On the completer: finish and complete the torch Future."""
        fut = self._tfut
        try:
            self._finish()
        except BaseException as e:
            if not fut.done():
                fut.set_exception(e)
            return
        if not fut.done():
            fut.set_result(self._result)

    def _arm(self) -> None:
        remaining = [len(self._futures)]
        lock = threading.Lock()

        def one_done(f: concurrent.futures.Future) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last or _error_of(f) is not None:
                _schedule(self._complete_future)

        if not self._futures:
            _schedule(self._complete_future)
        for f in self._futures:
            f.add_done_callback(one_done)

    # ------------------------------------------------------------------ torch's Work API

    def wait(self, timeout: Any = None) -> bool:
        """Block until the call is done (its outputs written); raise its error.

        ``timeout`` (seconds or a timedelta) bounds only this wait: DistTimeoutError
        when it passes first. Returns True, like torch.
        """
        self._finish(seconds(timeout))
        return True

    def is_completed(self) -> bool:
        """True once the call finished, successfully or not (never blocks)."""
        if self._finished:
            return True
        if not self._all_done():
            return False
        try:
            self._finish()
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
        return self._result

    def source_rank(self) -> int:
        """The global rank a receive came from."""
        return self._src

    def _source_rank(self) -> int:
        return self._src

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        """A ``torch.futures.Future`` completed with the output tensors when the call is
        done (or with its error)."""
        with self._lock:
            if self._tfut is None:
                self._tfut = torch.futures.Future()
                if in_completer():  # a callback waits inline: never on itself
                    fut = self._tfut
                else:
                    fut = None
                    self._arm()
        if fut is not None:
            self._complete_future()
        return self._tfut

    def __repr__(self) -> str:
        state = "done" if self._finished or self._all_done() else "pending"
        return f"<minidist.torch.Work {self._what} {state}>"


def done_work(result: Any = None, what: str = "call") -> Work:
    """A Work that is already complete (nothing had to be communicated)."""
    return Work([], None, result, what)
