"""Scratch arrays for the socket path's schedules, kept for the next call of their size.

One :class:`ScratchPool` per session, used on its loop's thread only.
"""

from __future__ import annotations

import numpy as np

KEPT = 2  # arrays kept per (dtype, size)
KEPT_BYTES = 64 << 10  # the largest array kept: a larger one is allocated for each call


class ScratchPool:
    """Arrays a call borrows (:meth:`take`) and hands back when it is done (:meth:`give`)."""

    def __init__(self) -> None:
        self._pool: dict[tuple[np.dtype, int], list[np.ndarray]] = {}

    def take(self, dtype: np.dtype, n: int) -> np.ndarray:
        """An array of ``n`` elements of ``dtype``: one given back earlier, else a new
        one (its contents are whatever the last user left)."""
        pool = self._pool.get((dtype, n))
        return pool.pop() if pool else np.empty(n, dtype)

    def give(self, a: np.ndarray | None) -> None:
        """Hand ``a`` back (None or an empty array: nothing); kept if it is at most
        :data:`KEPT_BYTES` and fewer than :data:`KEPT` of its kind are (a large array's
        pages cost more to keep than to take again from the system)."""
        if a is None or not a.size or a.nbytes > KEPT_BYTES:
            return
        pool = self._pool.setdefault((a.dtype, a.size), [])
        if len(pool) < KEPT:
            pool.append(a)
