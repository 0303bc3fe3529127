"""The RL layout under a small /dev/shm: every call checked bit for bit.

Groups as in ``examples/rl_groups.py``: the world, ``agents`` (local rank 0 of every
node), ``env_workers`` (every other rank) and ``node_workers`` (local ranks 1.. of this
node). Parameters (JSON, first argument): ``sizes`` (bytes per call, float32), ``rounds``,
``p2p`` (bytes of each send/recv of a ring over the world; 0: none), ``refuse_reads``
(``"peers"``: this process's reads of other processes fail with EPERM, as under a
container's seccomp profile for a peer; ``"all"``: every read does, its own start-up probe
too), ``async`` (also every group's all_reduce with ``async_op=True``, all in flight).
Each rank prints one ``RESULT`` line: ``kind=none`` with ``checks`` (calls whose every
element was checked), ``groups`` (its groups of two ranks or more), ``fast`` (groups
with fast slots), ``nofast`` (groups whose fast calls went over sockets), ``nomid``
(groups whose fast segment had no mid area), ``segs``/``noseg`` (groups with a
shared-memory algorithm segment / where a call had no room in it), ``reads`` (groups
whose ranks read each other's memory) and ``nop2p`` (1 if its inbox or stash could not
be had), or the error.
"""

from __future__ import annotations

import errno
import os

import numpy as np
from chaos_common import WrongResult, event, params, result

import minidist
from minidist import peer_memory
from minidist.process_state import STATE
from minidist.shm.fast_slots import MID_RANKS

p = params()
refuse = p.get("refuse_reads")
if refuse:  # before init: its key's probe reads this process too
    _read = peer_memory.read

    def read(pid: int, local: int, remote: int, nbytes: int) -> None:
        if refuse == "all" or pid != os.getpid():
            raise OSError(errno.EPERM, "Operation not permitted (refused for the test)")
        _read(pid, local, remote, nbytes)

    peer_memory.read = read

minidist.init()
rank, world = minidist.get_rank(), minidist.get_world_size()
per_node = minidist.get_local_world_size()
node = rank // per_node
agent_ranks = [k * per_node for k in range(world // per_node)]
worker_ranks = [r for r in range(world) if r % per_node]
agents = minidist.new_group(agent_ranks)
env_workers = minidist.new_group(worker_ranks)
node_workers = minidist.new_group([node * per_node + i for i in range(1, per_node)])
groups = [("world", None, list(range(world))), ("agents", agents, agent_ranks),
          ("env_workers", env_workers, worker_ranks),
          ("node_workers", node_workers, [node * per_node + i for i in range(1, per_node)])]
event("READY", rank=rank)


def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
    if not np.array_equal(got, want):
        bad = int(np.flatnonzero(got != want)[0])
        raise WrongResult(f"{what}: element {bad} is {got[bad]!r}, not {want[bad]!r}")


checks = 0
err: BaseException | None = None
try:
    for step in range(p.get("rounds", 1)):
        for nbytes in p["sizes"]:
            count = max(1, nbytes // 4)
            pattern = (np.arange(count) % 7 + 1).astype(np.float32)  # exact sums
            if p.get("async"):  # every group's all_reduce in flight at once
                mine = [(name, members, pattern * (rank + 1), g) for name, g, members in groups
                        if rank in members and len(members) > 1]
                works = [minidist.all_reduce(x, group=g, async_op=True) for _, _, x, g in mine]
                for work, (name, members, x, _) in zip(works, mine):
                    work.wait()
                    check(f"async all_reduce of {nbytes} B on {name}", x,
                          pattern * float(sum(m + 1 for m in members)))
                    checks += 1
            for name, g, members in groups:
                if rank not in members or len(members) < 2:
                    continue
                x = pattern * (rank + 1)
                minidist.all_reduce(x, group=g)
                check(f"all_reduce of {nbytes} B on {name}", x,
                      pattern * float(sum(m + 1 for m in members)))
                root = members[(step + count) % len(members)]
                y = pattern * (root + 1) if rank == root else np.zeros(count, np.float32)
                minidist.broadcast(y, src=root, group=g)
                check(f"broadcast of {nbytes} B from {root} on {name}", y, pattern * (root + 1))
                checks += 2
            if p.get("progress") and rank == 0:
                event("SIZE", nbytes=nbytes, step=step)
        if p.get("p2p") and world > 1:
            count = p["p2p"] // 4
            mine = np.full(count, rank + step, np.float32)
            got = np.empty(count, np.float32)
            left = (rank - 1) % world
            sent = minidist.isend(mine, (rank + 1) % world)
            minidist.recv(got, src=left)
            sent.wait()
            check(f"recv of {p['p2p']} B from {left}", got,
                  np.full(count, left + step, np.float32))
            checks += 1
    minidist.barrier()
except BaseException as e:  # noqa: BLE001 - reported, then the script ends
    err = e
door = STATE.blocking
session = door._session if door is not None else None
out: dict[str, int] = dict.fromkeys(("fast", "nofast", "nomid", "segs", "noseg", "reads",
                                     "nop2p"), 0)
if session is not None:  # what this rank's groups had of shared memory
    size_of = {g.id: g.size for g in (session.world, agents, env_workers, node_workers)
               if hasattr(g, "id")}
    for gid, slots in session.fast_segments.slots.items():
        mid, reads = session.fast_segments.room.get(gid, (False, False))
        out["fast" if slots is not None else "nofast"] += 1
        out["nomid"] += slots is not None and size_of.get(gid, 0) <= MID_RANKS and not mid
        out["reads"] += reads
    out["segs"] = sum(1 for s in session.shm.segments.values() if s.reserved)
    out["noseg"] = sum(1 for s in session.shm.segments.values() if s.refused)
    out["nop2p"] = int(session.p2p is not None and (session.p2p._no_inbox
                                                    or session.p2p._no_stash))
result(rank, err, checks=checks, groups=sum(1 for _, _, m in groups if rank in m
                                            and len(m) > 1), **out)
minidist.destroy()
