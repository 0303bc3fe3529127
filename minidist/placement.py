"""Where a job's ranks are: the node of every rank, the layout of a group over nodes, and
whether the ranks of a group may read each other's memory. Pure; from the rendezvous'
welcome (:meth:`minidist.plan.Planner.set_nodes`)."""

from __future__ import annotations

import numpy as np

from .group import Group


class Placement:
    """The ranks of a world of ``world_size``, all on one node until :meth:`set` says
    otherwise. ``nodes``: the node index of every rank; ``one_node``: whether there is
    only one."""

    def __init__(self, world_size: int) -> None:
        self.nodes: list[int] = [0] * world_size
        self.one_node = True
        self._layouts: dict[int, tuple[int, ...]] = {}
        self._read_keys: list[str | None] = [None] * world_size
        self._reads: dict[int, bool] = {}

    def set(self, nodes: list[int], read_keys: list[str | None] | None = None) -> None:
        """The node index of every rank, and what each must share with another to read
        its memory (:func:`minidist.peer_memory.key`; None: it cannot)."""
        self.nodes = list(nodes)
        self.one_node = max(self.nodes) == 0
        self._layouts.clear()
        if read_keys is None or len(read_keys) != len(self.nodes):
            read_keys = [None] * len(self.nodes)
        same: dict[str | None, str | None] = {}  # one string per distinct key
        self._read_keys = [same.setdefault(k, k) for k in read_keys]
        self._reads.clear()

    def layout(self, g: Group) -> tuple[int, ...]:
        """The node of each rank of ``g``, numbered from 0 in order of appearance."""
        layout = self._layouts.get(g.id)
        if layout is None:
            if self.one_node:
                layout = (0,) * g.size
            else:
                nodes = np.asarray(self.nodes)[list(g.ranks)]
                _, first, inverse = np.unique(nodes, return_index=True, return_inverse=True)
                order = np.empty(len(first), np.int64)
                order[np.argsort(first)] = np.arange(len(first))
                layout = tuple(order[inverse].tolist())
            self._layouts[g.id] = layout
        return layout

    def can_read(self, g: Group) -> bool:
        """Whether every rank of ``g`` (on one node) said it can read the others' memory
        (their keys, :func:`minidist.peer_memory.key`, are equal)."""
        ok = self._reads.get(g.id)
        if ok is None:
            keys = {self._read_keys[r] for r in g.ranks}
            ok = self._reads[g.id] = len(keys) == 1 and None not in keys
        return ok
