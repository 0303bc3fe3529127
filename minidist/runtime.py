"""The background event loop that runs every rank's I/O while the caller's thread waits."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from .env import uvloop_allowed

T = TypeVar("T")
END_GRACE = 1.0  # seconds the tasks pending when the loop stops have to end, cancelled


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (and not disabled with MINIDIST_UVLOOP=0)."""
    if uvloop_allowed(os.environ):
        try:
            import uvloop

            return uvloop.new_event_loop()
        except ImportError:
            pass
    return asyncio.new_event_loop()


class Runtime:
    """An event loop in a daemon thread. Blocking callers sleep in the kernel."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name="minidist-io", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self._end_tasks()

    def _end_tasks(self) -> None:
        """After the loop stopped: cancel the tasks still pending (a receive that a
        timeout left running, say) and let them finish, for up to END_GRACE seconds."""
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        if not tasks:
            return
        for t in tasks:
            t.cancel()
        self.loop.run_until_complete(asyncio.wait(tasks, timeout=END_GRACE))
        for t in tasks:
            if t.done() and not t.cancelled():
                t.exception()  # (retrieved: the caller that wanted it is gone)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run a coroutine on the loop; its result or exception arrives in the future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop and wait for it (the coroutine owns its deadline).
        The caller sleeps on a bare lock that the task's done-callback releases: the
        least a blocking call can cost."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("blocking minidist call from inside its own event loop; "
                               "use minidist.aio there instead")
        done = threading.Lock()
        done.acquire()
        tasks: list[asyncio.Task] = []

        def finished(task: asyncio.Task) -> None:
            tasks.append(task)
            done.release()

        def start() -> None:
            self.loop.create_task(coro).add_done_callback(finished)

        self.loop.call_soon_threadsafe(start)
        done.acquire()
        return tasks[0].result()

    def stop(self) -> None:
        """Stop the loop and join the thread (pending tasks are cancelled first)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()
