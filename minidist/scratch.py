"""Scratch arrays for the socket path's schedules, kept for the next call of their size.

One :class:`ScratchPool` per session, used on its loop's thread only.
"""

from __future__ import annotations

import numpy as np

KEPT = 2  # arrays kept per (dtype, size)


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
        """Hand ``a`` back (None or an empty array: nothing); kept if fewer than
        :data:`KEPT` of its kind are."""
        if a is None or not a.size:
            return
        pool = self._pool.setdefault((a.dtype, a.size), [])
        if len(pool) < KEPT:
            pool.append(a)
