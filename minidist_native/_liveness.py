"""Hearing that a peer is gone, while NCCL waits on it.

NCCL itself cannot tell a slow peer from a dead one on a node (its kernels spin on
memory the peer should write). minidist can: the rendezvous tells every rank within
seconds that a rank died or left. To hear it, this process keeps one receive posted
per peer it shares a communicator with, on an internal tag nobody sends on: such a
receive fails with PeerLostError exactly when minidist declares the peer lost or
departed. Receives open no connection (a rank connects only where it sends), so this
costs no socket; one that reaches its deadline is simply posted again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from minidist.errors import DistError, DistTimeoutError, PeerLostError
from minidist.plan import P2P_TAG_LIMIT

#: the internal point-to-point tag of the watches (no message is ever sent on it)
WATCH_TAG = P2P_TAG_LIMIT + 0x6E61

Callback = Callable[[int, BaseException], None]


class PeerWatch:
    """Per-peer watches of one minidist session (its door)."""

    def __init__(self, door: Any) -> None:
        self._door = door
        self._lock = threading.Lock()
        self._lost: dict[int, BaseException] = {}
        self._subs: dict[int, list[Callback]] = {}
        self._armed: set[int] = set()
        self._closed = False

    def lost(self, peers: tuple[int, ...] | list[int]) -> BaseException | None:
        """The error of the first of ``peers`` known to be gone, else None."""
        with self._lock:
            for p in peers:
                if p in self._lost:
                    return self._lost[p]
        return None

    def watch(self, peers: tuple[int, ...] | list[int], callback: Callback) -> None:
        """Call ``callback(peer, error)`` (on minidist's loop thread: it must not block)
        when any of ``peers`` is lost or leaves; at once for one already gone."""
        me = self._door.rank
        fire = []
        with self._lock:
            for p in peers:
                if p == me:
                    continue
                if p in self._lost:
                    fire.append((p, self._lost[p]))
                    continue
                self._subs.setdefault(p, []).append(callback)
                if p not in self._armed:
                    self._armed.add(p)
                    self._arm(p)
        for p, e in fire:
            callback(p, e)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._subs.clear()

    # ------------------------------------------------------------------ internals

    def _arm(self, peer: int) -> None:
        d = self._door
        try:
            item = d.plan.prepare_recv(None, peer, WATCH_TAG, None, internal=True)
            fut = d.submit(item)
        except DistError as e:  # the peer is already known to be gone, or minidist is
            self._fired(peer, e)
            return
        fut.add_done_callback(lambda f, p=peer: self._done(p, f))

    def _done(self, peer: int, f: Any) -> None:
        if f.cancelled():
            return  # minidist shut down
        e = f.exception()
        if e is None:  # someone sent on the watch tag: not ours to judge; keep watching
            self._rearm(peer)
        elif isinstance(e, DistTimeoutError):
            self._rearm(peer)
        else:
            self._fired(peer, e)

    def _rearm(self, peer: int) -> None:
        with self._lock:
            if self._closed:
                return
        # planning happens on a caller's thread, never on minidist's loop
        threading.Thread(target=self._arm, args=(peer,), daemon=True,
                         name="minidist-native-rearm").start()

    def _fired(self, peer: int, error: BaseException) -> None:
        if not isinstance(error, PeerLostError):
            error = PeerLostError(f"[minidist_native] lost track of global rank {peer}: "
                                  f"{error}", ranks=(peer,))
        with self._lock:
            if self._closed:
                return
            self._lost.setdefault(peer, error)
            subs = self._subs.pop(peer, [])
        for cb in subs:
            try:
                cb(peer, error)
            except Exception:  # noqa: BLE001 - a subscriber's trouble is its own
                pass
