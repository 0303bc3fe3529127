"""The blocking public functions: init, destroy, groups, collectives, the store.

They drive this process's :class:`~minidist.session.Session` on a background event
loop; the calling thread sleeps in the kernel while a call is in flight.
"""

from __future__ import annotations

import atexit
import os
import pickle
import sys
import threading
from collections.abc import Coroutine
from typing import Any

import numpy as np

from .env import default_timeout, detect
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
            timeout = default_timeout(os.environ)
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


def _adopt(session: Session, runtime: Runtime) -> None:
    """Make a session that a layer above started itself this process's session, as
    after :func:`init` (``minidist.torch`` starts one from torch's store)."""
    global _session, _runtime
    with _lock:
        if _session is not None:
            raise DistError("minidist is already initialized; call minidist.destroy() first")
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
    in which they created groups with exactly those members. ``timeout`` (seconds or a
    timedelta) bounds every call on the group instead of the job's timeout; 0 means
    "do not wait". ``backend`` is accepted for compatibility.
    """
    return _current()[0].new_group(ranks, timeout)


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
        g = s.new_group(list(parent.ranks[start:start + group_size]), timeout)
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
    s.send_first(p, r.loop)
    if async_op:
        return Work(r.submit(s.execute(p)))
    r.call(s.execute(p))
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


def reduce(array: np.ndarray, dst: int = 0, op: ReduceOp = ReduceOp.SUM,
           group: GroupArg = None, async_op: bool = False,
           algorithm: str | None = None) -> Work | None:
    """Reduce ``array`` across the group into ``array`` on global rank ``dst`` (in place);
    the other ranks' arrays are left as they were."""
    s, _ = _current()
    return _run(s.prepare_reduce(array, dst, op, group, algorithm), async_op)


def all_gather(output: np.ndarray, input: np.ndarray, group: GroupArg = None,
               async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Concatenate every rank's ``input`` into ``output``, in group-rank order
    (``output.size == input.size * group size``; like torch's all_gather_into_tensor)."""
    s, _ = _current()
    return _run(s.prepare_all_gather(output, input, group, algorithm), async_op)


def reduce_scatter(output: np.ndarray, input: np.ndarray, op: ReduceOp = ReduceOp.SUM,
                   group: GroupArg = None, async_op: bool = False,
                   algorithm: str | None = None) -> Work | None:
    """Reduce ``input`` (group size x ``output.size`` elements) across the group and
    give group rank ``i`` block ``i`` of the result in ``output``."""
    s, _ = _current()
    return _run(s.prepare_reduce_scatter(output, input, op, group, algorithm), async_op)


def gather(input: np.ndarray, output: np.ndarray | None = None, dst: int = 0,
           group: GroupArg = None, async_op: bool = False,
           algorithm: str | None = None) -> Work | None:
    """Concatenate every rank's ``input`` into ``output`` on global rank ``dst`` only."""
    s, _ = _current()
    return _run(s.prepare_gather(input, output, dst, group, algorithm), async_op)


def scatter(output: np.ndarray, input: np.ndarray | None = None, src: int = 0,
            group: GroupArg = None, async_op: bool = False,
            algorithm: str | None = None) -> Work | None:
    """Give group rank ``i`` block ``i`` of ``input`` (on global rank ``src``) in ``output``."""
    s, _ = _current()
    return _run(s.prepare_scatter(output, input, src, group, algorithm), async_op)


def all_to_all(output: np.ndarray, input: np.ndarray, group: GroupArg = None,
               async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Block ``j`` of ``input`` goes to group rank ``j``; block ``i`` of ``output`` comes
    from group rank ``i`` (equal blocks)."""
    s, _ = _current()
    return _run(s.prepare_all_to_all(output, input, group, algorithm), async_op)


# ---------------------------------------------------------------------- point-to-point


def isend(array: np.ndarray, dst: int, tag: int = 0, group: GroupArg = None) -> Work:
    """Send ``array`` to global rank ``dst``; the Work completes once it is on its way.

    Messages between two ranks with the same tag arrive in the order they were sent.
    """
    s, r = _current()
    return Work(r.submit(s.send(s.prepare_send(array, dst, tag, group))))


def send(array: np.ndarray, dst: int, tag: int = 0, group: GroupArg = None) -> None:
    """Blocking :func:`isend`."""
    s, r = _current()
    _send_blocking(s, r, s.prepare_send(array, dst, tag, group))


def _send_blocking(s: Session, r: Runtime, p) -> None:
    if not s.send_now(p, r.loop):  # a small message on an open Unix connection: done
        r.call(s.send(p))


def irecv(array: np.ndarray, src: int, tag: int = 0, group: GroupArg = None) -> Work:
    """Receive the next message from global rank ``src`` with ``tag`` into ``array``.

    CollectiveMismatchError if its shape or dtype differs (``array`` is then left as it
    was); DistTimeoutError if nothing comes before the timeout.
    """
    s, r = _current()
    return Work(r.submit(s.recv(s.prepare_recv(array, src, tag, group))), result=src)


def recv(array: np.ndarray, src: int, tag: int = 0, group: GroupArg = None) -> int:
    """Blocking :func:`irecv`; returns ``src``."""
    s, r = _current()
    r.call(s.recv(s.prepare_recv(array, src, tag, group)))
    return src


def send_object(obj: Any, dst: int, tag: int = 0, group: GroupArg = None) -> None:
    """Send any picklable object to global rank ``dst`` (like mpi4py's ``send``)."""
    s, r = _current()
    p = s.prepare_send(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dst, tag, group,
                       is_object=True)
    _send_blocking(s, r, p)


def recv_object(src: int, tag: int = 0, group: GroupArg = None) -> Any:
    """Receive the next object sent by global rank ``src`` with ``tag``."""
    s, r = _current()
    return pickle.loads(r.call(s.recv(s.prepare_recv(None, src, tag, group))))


# ---------------------------------------------------------------------- objects


def _pickle(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)


def broadcast_object(obj: Any, src: int = 0, group: GroupArg = None) -> Any:
    """``obj`` of global rank ``src``, on every rank of the group (pickled)."""
    me = get_rank()
    data = _pickle(obj) if me == src else None
    size = np.array([0 if data is None else data.size], np.int64)
    broadcast(size, src, group)
    buf = data.copy() if data is not None else np.empty(int(size[0]), np.uint8)
    broadcast(buf, src, group)
    return obj if me == src else pickle.loads(buf.tobytes())


def _padded(obj: Any, group: GroupArg) -> tuple[np.ndarray, np.ndarray, int]:
    """(every rank's pickled size, this rank's pickle padded to the largest, that width)."""
    data = _pickle(obj)
    sizes = np.empty(get_world_size(group), np.int64)
    all_gather(sizes, np.array([data.size], np.int64), group)
    width = int(sizes.max())
    padded = np.zeros(width, np.uint8)
    padded[:data.size] = data
    return sizes, padded, width


def _unpickle_all(out: np.ndarray, sizes: np.ndarray, width: int) -> list[Any]:
    return [pickle.loads(out[i * width:i * width + int(n)].tobytes())
            for i, n in enumerate(sizes)]


def all_gather_object(obj: Any, group: GroupArg = None) -> list[Any]:
    """Every rank's ``obj``, in group-rank order, on every rank (pickled)."""
    sizes, padded, width = _padded(obj, group)
    out = np.empty(width * sizes.size, np.uint8)
    all_gather(out, padded, group)
    return _unpickle_all(out, sizes, width)


def gather_object(obj: Any, dst: int = 0, group: GroupArg = None) -> list[Any] | None:
    """Every rank's ``obj`` in group-rank order on global rank ``dst``; None elsewhere."""
    sizes, padded, width = _padded(obj, group)
    mine = get_rank() == dst
    out = np.empty(width * sizes.size, np.uint8) if mine else None
    gather(padded, out, dst, group)
    return _unpickle_all(out, sizes, width) if mine else None


def scatter_object(objs: list[Any] | None, src: int = 0, group: GroupArg = None) -> Any:
    """Object ``i`` of ``objs`` (given on global rank ``src``) on group rank ``i``."""
    n = get_world_size(group)
    mine = get_rank() == src
    if mine:
        if objs is None or len(objs) != n:
            raise ValueError(f"scatter_object: src must pass a list of {n} objects")
        datas = [_pickle(o) for o in objs]
        sizes = np.array([d.size for d in datas], np.int64)
    else:
        sizes = np.empty(n, np.int64)
    broadcast(sizes, src, group)
    width = int(sizes.max())
    padded = None
    if mine:
        padded = np.zeros(width * n, np.uint8)
        for i, d in enumerate(datas):
            padded[i * width:i * width + d.size] = d
    out = np.empty(width, np.uint8)
    scatter(out, padded, src, group)
    size = int(sizes[get_rank(group)])
    return pickle.loads(out[:size].tobytes())


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
