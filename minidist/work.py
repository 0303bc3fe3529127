"""Work handles returned by ``async_op=True`` calls."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any


class Work:
    """A collective in flight. ``wait()`` blocks until it is done and raises its error."""

    def __init__(self, future: concurrent.futures.Future | None = None,
                 on_done: Callable[[], None] | None = None, result: Any = None,
                 source: Callable[[], int] | None = None) -> None:
        if future is None:
            future = concurrent.futures.Future()
            future.set_result(result)
        self._future = future
        self._on_done = on_done
        self._source = source

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the call completes; re-raise its error. Returns True like torch.

        ``timeout`` bounds only this wait (the call keeps its own deadline);
        TimeoutError if it passes first.
        """
        self._future.result(timeout)
        if self._on_done is not None:
            on_done, self._on_done = self._on_done, None
            on_done()
        return True

    def is_completed(self) -> bool:
        """True once the call finished, successfully or not (never blocks)."""
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._future.exception() is None

    def exception(self) -> BaseException | None:
        return self._future.exception() if self._future.done() else None

    def result(self) -> Any:
        self.wait()
        return self._future.result()

    def source_rank(self) -> int:
        """For a receive: the global rank the message came from (once it is done; the
        way to learn the sender of a receive from any rank)."""
        if self._source is None:
            raise ValueError("source_rank() is only defined for receives")
        self.wait()
        return self._source()

    def get_future(self) -> concurrent.futures.Future:
        """A concurrent.futures.Future that completes with the call."""
        return self._future

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"<minidist.Work {state}>"
