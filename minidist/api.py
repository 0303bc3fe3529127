"""The blocking public functions: init, destroy, groups, collectives, the store.

They drive this process's :class:`~minidist.session.Session` on a background event
loop; the calling thread sleeps in the kernel while a call is in flight.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Coroutine
from typing import Any

import numpy as np

from .env import DEFAULT_TIMEOUT, detect
from .errors import DistError, DistTimeoutError
from .group import NON_GROUP_MEMBER, Group
from .ops import ReduceOp
from .runtime import Runtime
from .session import Prepared, Session
from .work import Work

GroupArg = Group | object | None

_lock = threading.Lock()
_session: Session | None = None
_runtime: Runtime | None = None
_crashed = False


def _current() -> tuple[Session, Runtime]:
    s, r = _session, _runtime
    if s is None or r is None:
        raise DistError("minidist is not initialized: call minidist.init() first")
    return s, r


# ---------------------------------------------------------------------- lifecycle


def init(*, rank: int | None = None, world_size: int | None = None,
         master_addr: str | None = None, master_port: int | None = None,
         timeout: float | None = None) -> None:
    """Join the job described by the launcher's environment (or by the arguments).

    Understands ``minidist run``, torchrun, Slurm and Open MPI; with no launcher at all
    the process is a world of one. ``master_port`` given here is minidist's own
    rendezvous port. ``timeout`` (seconds; default ``MINIDIST_TIMEOUT`` or 300) bounds
    init and every later call. DistError if already initialized.
    """
    global _session, _runtime
    with _lock:
        if _session is not None:
            raise DistError("minidist is already initialized; call minidist.destroy() first")
        cfg = detect(os.environ, rank=rank, world_size=world_size, master_addr=master_addr,
                     master_port=master_port)
        if timeout is None:
            timeout = float(os.environ.get("MINIDIST_TIMEOUT", DEFAULT_TIMEOUT))
        runtime = Runtime()
        session = Session(cfg, timeout)
        try:
            runtime.call(session.start())
        except BaseException:
            runtime.call(session.close(graceful=False))
            runtime.stop()
            raise
        _session, _runtime = session, runtime
        _install_exit_hooks()


def destroy() -> None:
    """Leave the job and release every socket and thread; ``init`` may be called again."""
    global _session, _runtime
    with _lock:
        session, runtime = _session, _runtime
        _session = _runtime = None
    if session is None or runtime is None:
        return
    try:
        runtime.call(session.close(graceful=not _crashed))
    finally:
        runtime.stop()


def _install_exit_hooks() -> None:
    if getattr(_install_exit_hooks, "done", False):
        return
    _install_exit_hooks.done = True  # type: ignore[attr-defined]
    previous = sys.excepthook

    def excepthook(*args: Any) -> None:
        global _crashed
        _crashed = True  # an uncaught error: the others must hear this rank is lost
        previous(*args)

    sys.excepthook = excepthook
    atexit.register(destroy)


def is_initialized() -> bool:
    return _session is not None


def get_rank(group: GroupArg = None) -> int:
    """This process's rank in ``group`` (the world by default); -1 if not a member."""
    s, _ = _current()
    if group is NON_GROUP_MEMBER:
        return -1
    return (group or s.world).rank_of(s.rank)


def get_world_size(group: GroupArg = None) -> int:
    """The number of ranks in ``group`` (the world by default); -1 for a non-member."""
    s, _ = _current()
    if group is NON_GROUP_MEMBER:
        return -1
    return (group or s.world).size


def get_local_rank() -> int:
    """This process's index among the processes of its node."""
    return _current()[0].cfg.local_rank


def get_local_world_size() -> int:
    """The number of processes on this node."""
    return _current()[0].cfg.local_world_size


def get_node_rank() -> int:
    """The index of this process's node (0 for the node of rank 0)."""
    s, _ = _current()
    return s.nodes[s.rank]


def new_group(ranks: list[int] | None = None, timeout: float | None = None,
              backend: str | None = None) -> Group | object:
    """A group of the given global ranks (sorted, as torch does); opens no socket.

    Members call it in the same order as each other; a non-member gets
    ``GroupMember.NON_GROUP_MEMBER``. Unlike torch.distributed, ranks need not create
    groups they are not in: a group's identity follows from its members and the order
    in which they created groups with exactly those members. ``timeout`` and
    ``backend`` are accepted for compatibility.
    """
    return _current()[0].new_group(ranks)


def new_subgroups(group_size: int | None = None, group: GroupArg = None,
                  timeout: float | None = None, backend: str | None = None
                  ) -> tuple[Group | object, list[Group | object]]:
    """Split the world (or ``group``) into consecutive groups of ``group_size`` ranks
    (default: the processes per node), like torch. Returns (this rank's subgroup, all
    subgroups; NON_GROUP_MEMBER for those this rank is not in)."""
    s, _ = _current()
    parent = s.world if group is None else s.group(group, "new_subgroups")
    if group_size is None:
        group_size = s.cfg.local_world_size
    if not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"new_subgroups: group_size must be a positive int, not {group_size!r}")
    if parent.size % group_size:
        raise ValueError(f"new_subgroups: the group size {parent.size} does not divide "
                         f"by group_size={group_size}")
    subgroups, mine = [], NON_GROUP_MEMBER
    for start in range(0, parent.size, group_size):
        g = s.new_group(list(parent.ranks[start:start + group_size]))
        subgroups.append(g)
        if g is not NON_GROUP_MEMBER:
            mine = g
    return mine, subgroups


def get_process_group_ranks(group: GroupArg) -> list[int]:
    """The global ranks of ``group`` in group-rank order."""
    s, _ = _current()
    return list(_any_group(s, group).ranks)


def get_group_rank(group: GroupArg, global_rank: int) -> int:
    """The rank within ``group`` of ``global_rank``; ValueError if it is not a member."""
    s, _ = _current()
    g = _any_group(s, group)
    r = g.rank_of(global_rank)
    if r < 0:
        raise ValueError(f"global rank {global_rank} is not part of {g!r}")
    return r


def get_global_rank(group: GroupArg, group_rank: int) -> int:
    """The global rank of rank ``group_rank`` of ``group``; ValueError if out of range."""
    s, _ = _current()
    return _any_group(s, group).global_rank(group_rank)


def _any_group(s: Session, group: GroupArg) -> Group:
    if group is None:
        return s.world
    if group is NON_GROUP_MEMBER:
        raise ValueError("this rank is not a member of the group (NON_GROUP_MEMBER)")
    if not isinstance(group, Group):
        raise TypeError(f"expected a minidist group or None, not {type(group).__name__}")
    return group


# ---------------------------------------------------------------------- collectives


def _run(p: Prepared, async_op: bool) -> Work | None:
    s, r = _current()
    work = Work(r.submit(s.execute(p)))
    if async_op:
        return work
    work.wait()
    return None


def all_reduce(array: np.ndarray, op: ReduceOp = ReduceOp.SUM, group: GroupArg = None,
               async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Reduce ``array`` across the group in place, so every rank holds the result.

    Every rank ends with bit-identical bytes. ``algorithm`` (or the environment
    variable MINIDIST_ALGO_ALL_REDUCE) overrides the size-based choice. With
    ``async_op=True`` returns a :class:`Work`; otherwise returns None when done.
    """
    s, _ = _current()
    return _run(s.prepare_all_reduce(array, op, group, algorithm), async_op)


def broadcast(array: np.ndarray, src: int = 0, group: GroupArg = None,
              async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Copy ``array`` of global rank ``src`` into ``array`` on every rank of the group."""
    s, _ = _current()
    return _run(s.prepare_broadcast(array, src, group, algorithm), async_op)


def barrier(group: GroupArg = None, async_op: bool = False) -> Work | None:
    """Return once every rank of the group has entered the barrier."""
    s, _ = _current()
    return _run(s.prepare_barrier(group), async_op)


# ---------------------------------------------------------------------- store


class Store:
    """The job's key/value store (like torch's TCPStore); values are bytes."""

    def __init__(self, session: Session, runtime: Runtime) -> None:
        self._s = session
        self._r = runtime

    def _call(self, coro: Coroutine) -> Any:
        return self._r.call(coro)

    async def _req(self, body: dict, blob: bytes = b"", timeout: float | None = None):
        timeout = self._s.timeout if timeout is None else timeout
        local = self._s.local_store
        if local is None:
            return await self._s.client.request({**body, "timeout": timeout}, blob, timeout + 5)
        t = body["t"]
        try:
            if t == "kv_set":
                return await local.set(body["key"], blob)
            if t == "kv_get":
                return await local.get(body["key"], timeout)
            if t == "kv_wait":
                return await local.wait(body["keys"], timeout)
            if t == "kv_add":
                return await local.add(body["key"], body["amount"])
            if t == "kv_compare_set":
                return await local.compare_set(body["key"], body["expected"].encode("latin-1"),
                                               blob)
            if t == "kv_check":
                return local.check(body["keys"])
            if t == "kv_delete":
                return local.delete(body["key"])
            return len(local)
        except TimeoutError:
            raise DistTimeoutError(f"store: keys not set within {timeout:g} s") from None

    def _ask(self, body: dict, blob: bytes = b"", timeout: float | None = None,
             field: str | None = None) -> Any:
        reply = self._call(self._req(body, blob, timeout))
        if self._s.local_store is not None:
            return reply
        return reply.blob if field is None else reply.body[field]

    def set(self, key: str, value: bytes | str) -> None:
        """Set ``key`` to ``value``, waking every rank waiting for it."""
        self._ask({"t": "kv_set", "key": key}, _b(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting for it (DistTimeoutError past the deadline)."""
        return self._ask({"t": "kv_get", "key": key}, timeout=timeout)

    def add(self, key: str, amount: int = 1) -> int:
        """Add to the integer counter ``key`` (created at 0); return its new value."""
        return self._ask({"t": "kv_add", "key": key, "amount": int(amount)}, field="value")

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        """Return once every key is set (DistTimeoutError past the deadline)."""
        self._ask({"t": "kv_wait", "keys": list(keys)}, timeout=timeout, field="t")

    def check(self, keys: list[str]) -> bool:
        """True if every key is set (never waits)."""
        return self._ask({"t": "kv_check", "keys": list(keys)}, field="ok")

    def delete_key(self, key: str) -> bool:
        """Remove ``key``; True if it existed."""
        return self._ask({"t": "kv_delete", "key": key}, field="ok")

    def num_keys(self) -> int:
        return self._ask({"t": "kv_num_keys"}, field="value")

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected``; return its value after."""
        return self._ask({"t": "kv_compare_set", "key": key,
                          "expected": _b(expected).decode("latin-1")}, _b(desired))


def _b(v: bytes | str) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


def get_store() -> Store:
    """The job's key/value store."""
    s, r = _current()
    return Store(s, r)
