"""Communicator keys and the rendezvous store's key names (pure).

A communicator serves one (group, device) of this process: :class:`CommKey`. Groups
are told apart by minidist's group id and member list (a group's id is the same on
every member); the device by its index in this process. Point-to-point messages
between two ranks use a communicator of their own, as torch's NCCL backend does
(:func:`pair_key`).

Each set-up of a communicator gets its own namespace in the store,
``minidist_native/v1/<scope>/c<ordinal>``: the ordinal counts the set-ups this process
has started for that scope, which is the same count on every member, since the members
make their CUDA calls on a group in the same order.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

ROOT = "minidist_native/v1"


@dataclass(frozen=True)
class CommKey:
    """One communicator of this process: a group (``group_id`` and its global ranks in
    group-rank order; for a pair, ``pair=True`` and the two ranks sorted) and a device
    index of this process."""

    group_id: int
    ranks: tuple[int, ...]
    device: int
    pair: bool = False

    @property
    def scope(self) -> str:
        """The part of the store key every member computes alike (the device index is
        this process's own and may differ between members, so it is not part of it)."""
        if self.pair:
            return f"p2p/{self.ranks[0]}-{self.ranks[1]}"
        return f"g{self.group_id:016x}-n{len(self.ranks)}"

    def __str__(self) -> str:
        what = (f"pair {self.ranks[0]}<->{self.ranks[1]}" if self.pair
                else f"group {self.group_id:#x} ranks {list(self.ranks)[:8]}"
                + ("..." if len(self.ranks) > 8 else ""))
        return f"{what} on cuda:{self.device}"


def group_key(group_id: int, ranks: tuple[int, ...], device: int) -> CommKey:
    return CommKey(int(group_id), tuple(int(r) for r in ranks), int(device))


def pair_key(a: int, b: int, device: int) -> CommKey:
    """The communicator for messages between global ranks ``a`` and ``b``."""
    if a == b:
        raise ValueError(f"a point-to-point pair needs two ranks, got {a} twice")
    lo, hi = sorted((int(a), int(b)))
    return CommKey(0, (lo, hi), int(device), pair=True)


@dataclass(frozen=True)
class Names:
    """The store keys of one set-up (``base`` = ``ROOT/<scope>/c<ordinal>``)."""

    base: str

    def record(self, group_rank: int) -> str:
        return f"{self.base}/rec/{group_rank}"

    def records(self, n: int) -> list[str]:
        return [self.record(i) for i in range(n)]

    @property
    def uid(self) -> str:
        return f"{self.base}/uid"

    @property
    def failed(self) -> str:
        return f"{self.base}/failed"

    def ipc(self, group_rank: int) -> str:
        return f"{self.base}/ipc/{group_rank}"

    @property
    def done(self) -> str:
        return f"{self.base}/done"

    def every(self, n: int) -> list[str]:
        """Every key a set-up of ``n`` members may write (removed once all are done)."""
        return [*self.records(n), self.uid, self.failed,
                *(self.ipc(i) for i in range(n)), self.done]


def host_declaration(global_rank: int) -> str:
    """The key by which a rank says that it passes CPU tensors (see declare_host)."""
    return f"{ROOT}/host/{global_rank}"


class Ordinals:
    """How many set-ups this process has started per scope (thread-safe)."""

    def __init__(self) -> None:
        self._n: dict[str, int] = {}
        self._lock = threading.Lock()

    def next(self, key: CommKey) -> Names:
        with self._lock:
            k = self._n.get(key.scope, 0)
            self._n[key.scope] = k + 1
        return Names(f"{ROOT}/{key.scope}/c{k}")
