"""One thread per process that watches the CUDA work in flight (as torch's NCCL
watchdog does) and completes each call's future.

A watched item says, each time it is polled, whether its work is done: its CUDA event
has completed (success), or it failed: NCCL reported an asynchronous error, a peer was
lost, or its deadline passed; then the item itself aborts its communicator, so that
the stream it blocks is released, and the future fails with the minidist error. The
thread spins briefly after new work, then backs off to 1 ms sleeps, and sleeps on a
condition when nothing is in flight.

A blocking call never reaches the thread: its item is made with :meth:`Watchdog.defer`
and polled on the caller's own thread (:meth:`Watchdog.settle`), with no hand-off
between threads. An asynchronous call's item is handed to the thread
(:meth:`Watchdog.start`); a caller that later waits for it takes it back.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol


class Watched(Protocol):
    future: concurrent.futures.Future

    def poll(self, now: float) -> tuple[bool, BaseException | None]:
        """(finished, its error or None). Called on the watchdog's thread only."""
        ...


class Watchdog:
    def __init__(self, name: str = "minidist-native-watchdog", max_sleep: float = 1e-3,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.max_sleep = max_sleep
        self.clock = clock
        self._items: list[Watched] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def add(self, item: Watched) -> concurrent.futures.Future:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name=self.name,
                                                daemon=True)
                self._thread.start()
            self._items.append(item)
            self._cond.notify()
        f = item.future
        f.watched = item  # type: ignore[attr-defined]  (for settle)
        f.registered = True  # type: ignore[attr-defined]
        return f

    @staticmethod
    def defer(item: Watched) -> concurrent.futures.Future:
        """``item``'s future, not yet watched by the thread: :meth:`settle` polls it on
        the caller's thread, :meth:`start` hands it to the thread."""
        f = item.future
        f.watched = item  # type: ignore[attr-defined]
        f.registered = False  # type: ignore[attr-defined]
        return f

    def start(self, future: concurrent.futures.Future) -> None:
        """Have the thread watch a deferred future's item (no-op for any other)."""
        item = getattr(future, "watched", None)
        if item is not None and not getattr(future, "registered", True):
            self.add(item)

    def claim(self, item: Watched) -> bool:
        """Take ``item`` back from the thread (True), unless it is finished or being
        finished there (False: its future tells the outcome)."""
        with self._cond:
            if item in self._items:
                self._items.remove(item)
                return True
            return False

    def settle(self, future: concurrent.futures.Future, timeout: float | None = None
               ) -> bool:
        """Wait for ``future`` (one that :meth:`add` or :meth:`defer` returned) by
        polling its item on the caller's thread; True when it is done (its outcome
        set), False when ``timeout`` seconds passed first (the item is handed back to
        the thread)."""
        item = getattr(future, "watched", None)
        if item is None or (getattr(future, "registered", False) and not self.claim(item)):
            try:
                future.exception(timeout)
            except concurrent.futures.TimeoutError:
                return False
            return True
        end = None if timeout is None else self.clock() + timeout
        idle = 0
        while True:
            now = self.clock()
            try:
                done, error = item.poll(now)
            except BaseException as e:  # noqa: BLE001 - the poll itself failed
                done, error = True, e
            if done:
                _complete(future, error)
                return True
            if end is not None and now >= end:
                self.add(item)
                return False
            idle += 1
            _pause(idle, self.max_sleep)

    def pending(self) -> int:
        with self._cond:
            return len(self._items)

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def _run(self) -> None:
        idle = 0
        while True:
            with self._cond:
                while not self._items and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self._items:
                    return
                items = list(self._items)
            now = self.clock()
            finished: list[tuple[Watched, BaseException | None]] = []
            for item in items:
                try:
                    done, error = item.poll(now)
                except BaseException as e:  # noqa: BLE001 - the poll itself failed
                    done, error = True, e
                if done:
                    finished.append((item, error))
            if finished:
                with self._cond:  # a caller may have claimed one meanwhile
                    finished = [(i, e) for i, e in finished if i in self._items]
                    for item, _ in finished:
                        self._items.remove(item)
                for item, error in finished:
                    _complete(item.future, error)
                idle = 0
                continue
            idle += 1
            _pause(idle, self.max_sleep)

    def after_fork(self) -> None:
        """In a forked child: forget the parent's watched items and its lock."""
        self._items = []
        self._cond = threading.Condition()
        self._thread = None
        self._stopping = False


def _complete(future: concurrent.futures.Future, error: BaseException | None) -> None:
    """Set a finished item's outcome (once: the thread and a waiting caller may both
    have seen it finish)."""
    if not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


def _pause(idle: int, max_sleep: float) -> None:
    """A few busy polls first (a short collective ends within microseconds of being
    noticed), then sleeps growing to ``max_sleep``."""
    if idle > 50:
        time.sleep(min(max_sleep, 1e-5 * (idle - 50)))
    else:
        time.sleep(0)


_dog: Watchdog | None = None
_dog_lock = threading.Lock()


def watchdog() -> Watchdog:
    global _dog
    with _dog_lock:
        if _dog is None:
            _dog = Watchdog()
        return _dog


def _reset_after_fork() -> None:
    global _dog, _dog_lock
    _dog_lock = threading.Lock()
    if _dog is not None:
        _dog.after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)
