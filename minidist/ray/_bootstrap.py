"""How the actors of a Ray collective group find each other, and which minidist job
serves the group.

Everything travels through Ray's internal key/value store (the GCS), under the
namespace ``minidist`` and keys ``<ray job id>/<group name>/...``; no port is chosen by
hand and nothing is written to disk:

1. rank 0 of the Ray group clears the group's keys (left over by an earlier group of
   that name that failed while starting), then writes ``open`` = a fresh nonce;
2. every other rank waits for ``open`` and writes ``m/<rank>``: its own nonce, the
   ``open`` nonce it answers, its Ray node and the minidist jobs its process already
   belongs to (rewritten if ``open`` changes, so a stale ``open`` only delays it);
3. rank 0 waits for every ``m/<rank>`` that answers its ``open``, decides, and writes
   ``plan``; a rank takes only the plan that names its own nonce;
4. once every rank has the plan (the new job's welcome, or a barrier on the group),
   rank 0 deletes the group's keys.

The decision: if every member's process already belongs to one minidist job (an
earlier Ray group of these actors created it), the new Ray group is a group of that
job, a tag on its connections (no socket, no port). Otherwise the Ray group starts a
new minidist job whose world is the Ray group: rank 0 hosts the job's rendezvous on a
free port and the plan carries its address, port and secret.

A process may belong to several jobs (one door each); a job lives as long as some Ray
group of this process uses it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import ray
from ray.experimental import internal_kv as kv

from .. import forkguard, startup
from ..door import Door
from ..env import LaunchConfig
from ..errors import DistError, DistTimeoutError
from ..group import Group
from ..kvstore import Store
from ..process_state import STATE

log = logging.getLogger("minidist.ray")

NAMESPACE = "minidist"
_POLL_FIRST, _POLL_MAX = 0.002, 0.1  # seconds between two looks at the store


@dataclass(eq=False)
class Job:
    """A minidist job this process belongs to, and the Ray groups of this process on it."""

    door: Door
    hosts: bool  # this process runs the job's rendezvous
    groups: set[str] = field(default_factory=set)




def jobs() -> list[Job]:
    """The jobs this process belongs to through Ray groups, in the order it joined them
    (kept in the process's state: :data:`minidist.process_state.STATE`)."""
    with STATE.lock:
        return list(STATE.jobs)


# ---------------------------------------------------------------------- the store


def _get(key: str) -> bytes | None:
    return kv._internal_kv_get(key, namespace=NAMESPACE)


def _put(key: str, value: str) -> None:
    kv._internal_kv_put(key, value, overwrite=True, namespace=NAMESPACE)


def _clear(prefix: str) -> None:
    try:
        kv._internal_kv_del(prefix, del_by_prefix=True, namespace=NAMESPACE)
    except Exception as e:  # noqa: BLE001 - cleaning up must not hide the real outcome
        log.warning("minidist.ray: could not delete the keys %s*: %s", prefix, e)


class _Deadline:
    def __init__(self, timeout: float, name: str) -> None:
        self.end = time.monotonic() + timeout
        self.timeout, self.name = timeout, name
        self._delay = _POLL_FIRST

    def sleep(self, waiting_for: str, missing: tuple[int, ...] | list[int] = ()) -> None:
        left = self.end - time.monotonic()
        if left <= 0:
            raise DistTimeoutError(
                f"Ray collective group {self.name!r} (backend minidist): {waiting_for} "
                f"within {self.timeout:g} s. Every rank must call init_collective_group "
                "with the same world_size and group_name (create groups in the same order "
                "on every actor)", collective="init_collective_group", missing=missing)
        time.sleep(min(self._delay, left))
        self._delay = min(self._delay * 1.5, _POLL_MAX)


def _prefix(name: str) -> str:
    """The group's keys: under the Ray job (one driver's actors) and the group name
    (quoted, so that no name is a prefix of another's keys)."""
    return f"{ray.get_runtime_context().get_job_id()}/{quote(name, safe='')}/"


def _record(raw: bytes | None) -> dict[str, Any] | None:
    """A JSON object read from the store; None for anything else (a stale or foreign
    value)."""
    if raw is None:
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


# ---------------------------------------------------------------------- joining


def join(name: str, world_size: int, rank: int, timeout: float) -> tuple[Job, Group | None]:
    """Join Ray group ``name`` as ``rank`` of ``world_size``: (the job, the minidist
    group; None for the job's world)."""
    with STATE.lock:  # Ray creates the groups of one process one at a time anyway
        if world_size == 1:
            cfg = LaunchConfig(0, 1, 0, 1, "127.0.0.1", 0, secrets.token_hex(16).encode(),
                               False, "ray")
            return _add(Job(startup.start(cfg, timeout), hosts=False), name), None
        ctx = ray.get_runtime_context()
        me = {"nonce": secrets.token_hex(8), "pid": os.getpid(), "node": ctx.get_node_id(),
              "world_size": world_size,
              "ip": ray.util.get_node_ip_address(),
              "jobs": {j.door.job: j.door.rank for j in STATE.jobs}}
        deadline = _Deadline(timeout, name)
        prefix = _prefix(name)
        if rank == 0:
            return _lead(prefix, name, world_size, me, timeout, deadline)
        return _follow(prefix, name, world_size, rank, me, timeout, deadline)


def _lead(prefix: str, name: str, world_size: int, me: dict[str, Any], timeout: float,
          deadline: _Deadline) -> tuple[Job, Group | None]:
    _clear(prefix)
    opened = secrets.token_hex(8)
    _put(prefix + "open", opened)
    members: list[dict[str, Any] | None] = [me] + [None] * (world_size - 1)
    try:
        while True:
            missing = [r for r, m in enumerate(members) if m is None]
            for r in missing:
                rec = _record(_get(f"{prefix}m/{r}"))
                if rec is not None and rec.get("open") == opened:
                    members[r] = rec
            missing = [r for r, m in enumerate(members) if m is None]
            if not missing:
                break
            deadline.sleep(f"ranks {missing} did not call init_collective_group", missing)
    except BaseException:
        _clear(prefix)
        raise
    plan: dict[str, Any] = {"open": opened, "nonces": [m["nonce"] for m in members]}
    sizes = {r: m.get("world_size") for r, m in enumerate(members)}
    if len(set(sizes.values())) > 1:  # every rank is told, and raises
        msg = (f"Ray collective group {name!r} (backend minidist): the ranks passed "
               f"different world sizes (rank: world_size) {sizes}")
        _put(prefix + "plan", json.dumps({**plan, "error": msg}))
        raise ValueError(msg)
    shared = _shared_job(members)
    if shared is not None:
        job, ranks = shared
        plan.update(mode="group", job=job.door.job, ranks=ranks, id=secrets.randbits(62) | 1)
        _put(prefix + "plan", json.dumps(plan))
        try:
            return job_group(job, name, plan, timeout)
        finally:
            _clear(prefix)
    # a new job: this process hosts its rendezvous on a free port
    layout, one_node = _layout(members)
    secret = secrets.token_hex(16)
    host = "127.0.0.1" if one_node else "0.0.0.0"
    addr = "127.0.0.1" if one_node else me["ip"]

    def announce(_host: str, port: int) -> None:
        _put(prefix + "plan", json.dumps({**plan, "mode": "job", "addr": addr, "port": port,
                                          "secret": secret, "layout": layout}))

    cfg = LaunchConfig(0, world_size, 0, layout[0][1], "127.0.0.1", 0, secret.encode(),
                       False, "ray")
    try:
        door = startup.start(cfg, timeout, host=(host, 0), announce=announce)
    finally:  # started: every rank has read the plan; failed: nobody needs it
        _clear(prefix)
    return _add(Job(door, hosts=True), name), None


def _follow(prefix: str, name: str, world_size: int, rank: int, me: dict[str, Any],
            timeout: float, deadline: _Deadline) -> tuple[Job, Group | None]:
    answered = None
    while True:
        raw = _get(prefix + "open")
        if raw is not None and raw.decode() != answered:
            answered = raw.decode()
            _put(f"{prefix}m/{rank}", json.dumps({**me, "open": answered}))
        if answered is not None:
            plan = _record(_get(prefix + "plan"))
            nonces = plan.get("nonces") if plan is not None else None
            if plan is not None and plan.get("open") == answered and "error" in plan:
                raise ValueError(plan["error"])
            if (plan is not None and plan.get("open") == answered
                    and isinstance(nonces, list) and len(nonces) == world_size
                    and nonces[rank] == me["nonce"]):
                break
        deadline.sleep("rank 0 did not publish the group's plan" if answered else
                       "rank 0 did not call init_collective_group", [0])
    if plan["mode"] == "group":
        job = next((j for j in STATE.jobs if j.door.job == plan["job"]), None)
        if job is None:  # cannot happen while STATE.lock is held; said plainly if it does
            raise DistError(f"Ray collective group {name!r}: this process left minidist job "
                            f"{plan['job']} while the group was being created")
        return job_group(job, name, plan, timeout)
    local_rank, local_size, agent = plan["layout"][rank]
    cfg = LaunchConfig(rank, world_size, local_rank, local_size, plan["addr"],
                       int(plan["port"]), plan["secret"].encode(), False, "ray",
                       host_agent=bool(agent))
    return _add(Job(startup.start(cfg, timeout), hosts=False), name), None


def job_group(job: Job, name: str, plan: dict[str, Any],
              timeout: float) -> tuple[Job, Group]:
    """The Ray group as a group of an existing job (ranks in Ray's rank order); a
    barrier on it tells rank 0 that every member has the plan."""
    g = Group(int(plan["id"]), tuple(int(r) for r in plan["ranks"]), f"ray:{name}",
              timeout=timeout)
    job.door.wait(job.door.plan.prepare_barrier(g))
    return _add(job, name), g


def _shared_job(members: list[dict[str, Any]]) -> tuple[Job, list[int]] | None:
    """A job of this process (rank 0's) that every member belongs to, with distinct
    ranks: the first such job this process joined."""
    for job in STATE.jobs:
        ranks = [m["jobs"].get(job.door.job) for m in members]
        if None not in ranks and len(set(ranks)) == len(ranks):
            return job, ranks
    return None


def _layout(members: list[dict[str, Any]]) -> tuple[list[list[Any]], bool]:
    """Per rank (local rank, processes on its node, hosts its node's agent), from the
    Ray node ids; and whether the group fits on one node."""
    nodes: dict[str, list[int]] = {}
    for r, m in enumerate(members):
        nodes.setdefault(m["node"], []).append(r)
    first = members[0]["node"]
    out = []
    for r, m in enumerate(members):
        on = nodes[m["node"]]
        local = on.index(r)
        out.append([local, len(on), local == 0 and m["node"] != first])
    return out, len(nodes) == 1


def _add(job: Job, name: str) -> Job:
    if job not in STATE.jobs:
        STATE.jobs.append(job)
    job.groups.add(name)
    return job


# ---------------------------------------------------------------------- leaving


DEPARTED = "minidist.ray/departed"  # the job's store: how many ranks have left it


def leave(job: Job, name: str) -> None:
    """Ray group ``name`` of this process no longer uses ``job``; the last one leaves
    the job.

    The process that hosts the job's rendezvous must outlive the others' use of it
    (they may still hold groups of the job without it), so it leaves on a thread of
    its own once every other rank has counted itself out in the job's store, however
    long that takes; destroying the group on this actor does not wait. (If a member
    died, the count never completes: the rendezvous then stays until this process
    ends.)"""
    with STATE.lock:
        job.groups.discard(name)
        if job.groups or job not in STATE.jobs:
            return
        STATE.jobs.remove(job)
    if job.hosts:
        threading.Thread(target=_close_when_alone, args=(job.door,), daemon=True,
                         name="minidist-ray-leave").start()
        return
    if job.door.world.size > 1:
        try:
            Store(job.door).add(DEPARTED, 1)
        except DistError as e:  # the job is broken already: nobody waits for the count
            log.info("minidist.ray: leaving job %s: %s", job.door.job, e)
    _close(job.door)


def _close_when_alone(door: Door) -> None:
    store, others, delay = Store(door), door.world.size - 1, 0.05
    try:
        while store.add(DEPARTED, 0) < others:
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)
    except DistError as e:
        log.info("minidist.ray: job %s: %s", door.job, e)
    _close(door)


def _close(door: Door, graceful: bool = True) -> None:
    try:
        door.leave(graceful=graceful)
    except Exception as e:  # noqa: BLE001 - leaving must not raise over the caller's error
        log.warning("minidist.ray: leaving job %s: %s", door.job, e)


@atexit.register
def _at_exit() -> None:
    """The process ends with groups still open: leave every job (a host waits a few
    seconds at most for the others; after that they see it as lost). Nothing in a
    process forked from the one that joined (see :mod:`minidist.forkguard`)."""
    if forkguard.parent() is not None:
        return
    lock = STATE.lock
    locked = lock.acquire(timeout=1.0)  # a group being created must not hold us up
    try:
        left, STATE.jobs[:] = list(STATE.jobs), []
    finally:
        if locked:
            lock.release()
    threads = [threading.Thread(target=_close, args=(j.door,), daemon=True) for j in left]
    for t in threads:
        t.start()
    end = time.monotonic() + 5.0
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
