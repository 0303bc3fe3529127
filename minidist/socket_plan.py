"""Planning the calls that go over sockets (or through the ``shared_memory`` algorithm's
segment): the algorithm (the one asked for, the job's override, the cost model's choice
or the size-based default) and its schedule. Pure: no socket, no event loop."""

from __future__ import annotations

import numpy as np

from . import algorithms, ops, wire
from .algorithms import cost
from .algorithms import shm as shm_algorithm
from .algorithms.schedule import Schedule
from .group import Group
from .placement import Placement
from .prepared import Call

SHM_BROADCAST_MIN_BYTES = 256 * 1024


class SocketPlanner:
    """The algorithms and schedules of one rank's calls. ``shm_enabled``: whether shared
    memory may be used; ``costs``: the cost model's calibration; ``forced``: the job's
    algorithm overrides (collective -> name; the dict is read, so later changes
    count)."""

    def __init__(self, rank: int, placement: Placement, shm_enabled: bool, costs: object,
                 forced: dict[str, str]) -> None:
        self.rank = rank
        self.placement = placement
        self.shm_enabled = shm_enabled
        self.costs = costs
        self.forced = forced

    def plan(self, kind: wire.Kind, g: Group, flat: np.ndarray, inp: np.ndarray,
             count: int, shape: tuple[int, ...], root: int, algorithm: str | None,
             shm: bool | None = None) -> tuple:
        """(algorithm, its wire index, shape digest, schedule, dtype code) of a call
        (``shm``: whether shared memory may be used; None: if it is allowed)."""
        collective = kind.name.lower()
        instead = shm is not None  # a stand-in for a call that had to give shared memory up
        shm = self.shm_enabled if shm is None else shm
        # the same on every rank: the whole vector (for gather and scatter, the root's)
        nbytes = count * flat.itemsize * (1 if collective in algorithms.IN_PLACE else g.size)
        layout = self.placement.layout(g)
        forced = algorithm or self.forced.get(collective)
        if instead and forced == "shared_memory":
            forced = None
        if forced == "shared_memory" and (len(set(layout)) > 1 or not shm):
            raise ValueError(f"{collective}: algorithm 'shared_memory' needs a group on one "
                             "node and shared memory enabled (MINIDIST_SHM is not 0)")
        if (kind == wire.Kind.BROADCAST and forced is None and shm
                and len(set(layout)) == 1 and nbytes >= SHM_BROADCAST_MIN_BYTES):
            forced = "shared_memory"  # one node, a large vector: one copy in, one out
        if kind == wire.Kind.ALL_REDUCE and forced is None:
            if len(set(layout)) == g.size > 1:
                pass  # one rank per node: nothing to do inside nodes, a flat algorithm
            elif len(set(layout)) > 1:
                forced = "hierarchical"  # the group spans nodes: reduce inside each first
            else:  # one node: the cost model picks
                chunk = shm_algorithm.chunk_elements(g.size, flat.itemsize) * flat.itemsize
                forced = cost.choose(g.size, nbytes, self.costs, chunk,
                                     cost.CANDIDATES if shm
                                     else cost.CANDIDATES[:-1], itemsize=flat.itemsize)
        if kind == wire.Kind.ALL_TO_ALL and forced is None:  # the replay picks
            forced = cost.choose_replayed("all_to_all", g.size, count, self.costs,
                                          cost.ALL_TO_ALL_CANDIDATES, itemsize=flat.itemsize,
                                          nodes=layout)
        name = choose_algorithm(collective, g.size, nbytes, count, forced)
        sched = algorithms.make_schedule(collective, name, g.rank_of(self.rank), g.size,
                                         count, g.rank_of(root) if root >= 0 else 0,
                                         nodes=layout, itemsize=flat.itemsize)
        return (name, algorithms.wire_index(collective, name), wire.shape_digest(shape),
                sched, ops.dtype_code(flat.dtype))

    def schedule(self, call: Call, bufs: dict[str, np.ndarray]) -> Schedule:
        """The schedule ``call`` (planned for shared memory: the fast path, or the
        ``shared_memory`` algorithm) runs instead when its group has no shared memory to
        use: what the socket path would choose, never ``shared_memory`` (the same on
        every rank, which keeps ``call`` itself: its frames carry its algorithm)."""
        return self.plan(call.kind, call.group, bufs["out"], bufs["in"], call.count, (),
                         call.root, None, shm=False)[3]


def choose_algorithm(collective: str, size: int, nbytes: int, count: int,
                     algorithm: str | None) -> str:
    """The algorithm for a call: the one given, else the size-based default."""
    name = algorithm or algorithms.choose(collective, size, nbytes, count=count)
    if name not in algorithms.ALGORITHMS[collective]:
        algorithms.wire_index(collective, name)  # ValueError naming the known ones
    return name
