"""The blocking public functions: init, destroy, groups, collectives, the store.

They plan each call and pass it through this process's door (:mod:`minidist.door`),
whose session runs on a background event loop; the calling thread sleeps in the kernel
while a call is in flight.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import facade, fast_repeat, objects, startup
from .door import Door, Planned
from .env import default_timeout, detect
from .group import Group
from .kvstore import Store
from .ops import ReduceOp
from .process_state import STATE
from .work import Work

GroupArg = Group | object | None

door = STATE.door
"""This process's door (see :mod:`minidist.door`): how layers built on minidist
(``minidist.torch``) plan and start calls. DistError if not initialized."""


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
    def start() -> Door:
        cfg = detect(os.environ, rank=rank, world_size=world_size, master_addr=master_addr,
                     master_port=master_port)
        return startup.start(cfg, default_timeout(os.environ) if timeout is None else timeout)

    STATE.join(start)


def attach(d: Door) -> None:
    """Make a door that a layer above started itself (``minidist.torch`` joins from
    torch's store) this process's door, as after :func:`init`."""
    STATE.join(lambda: d)


def destroy() -> None:
    """Leave the job and release every socket and thread; ``init`` may be called again."""
    STATE.leave()


def is_initialized() -> bool:
    """Whether this process has joined a job through the blocking API."""
    return STATE.blocking is not None


def get_rank(group: GroupArg = None) -> int:
    """This process's rank in ``group`` (the world by default); -1 if not a member."""
    return door().rank_in(group)


def get_world_size(group: GroupArg = None) -> int:
    """The number of ranks in ``group`` (the world by default); -1 for a non-member."""
    return door().size_of(group)


def get_local_rank() -> int:
    """This process's index among the processes of its node."""
    return door().local_rank


def get_local_world_size() -> int:
    """The number of processes on this node."""
    return door().local_world_size


def get_node_rank() -> int:
    """The index of this process's node (0 for the node of rank 0)."""
    return door().node_rank


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
    return door().plan.new_group(ranks, timeout)


def new_subgroups(group_size: int | None = None, group: GroupArg = None,
                  timeout: float | None = None, backend: str | None = None
                  ) -> tuple[Group | object, list[Group | object]]:
    """Split the world (or ``group``) into consecutive groups of ``group_size`` ranks
    (default: the processes per node), like torch. Returns (this rank's subgroup, all
    subgroups; NON_GROUP_MEMBER for those this rank is not in)."""
    return door().new_subgroups(group_size, group, timeout)


def get_process_group_ranks(group: GroupArg) -> list[int]:
    """The global ranks of ``group`` in group-rank order."""
    return list(door().group_of(group).ranks)


def get_group_rank(group: GroupArg, global_rank: int) -> int:
    """The rank within ``group`` of ``global_rank``; ValueError if it is not a member."""
    g = door().group_of(group)
    r = g.rank_of(global_rank)
    if r < 0:
        raise ValueError(f"global rank {global_rank} is not part of {g!r}")
    return r


def get_global_rank(group: GroupArg, group_rank: int) -> int:
    """The global rank of rank ``group_rank`` of ``group``; ValueError if out of range."""
    return door().group_of(group).global_rank(group_rank)


# ---------------------------------------------------------------------- collectives


def _run(item: Planned, async_op: bool) -> Work | None:
    d = door()
    if async_op:
        return Work(d.submit(item))
    d.wait(item)
    return None


def all_reduce(array: np.ndarray, op: ReduceOp = ReduceOp.SUM, group: GroupArg = None,
               async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Reduce ``array`` across the group in place, so every rank holds the result.

    Every rank ends with bit-identical bytes. ``algorithm`` (or the environment
    variable MINIDIST_ALGO_ALL_REDUCE) overrides the size-based choice. With
    ``async_op=True`` returns a :class:`Work`; otherwise returns None when done.
    """
    return _run(door().plan.prepare_all_reduce(array, op, group, algorithm), async_op)


def broadcast(array: np.ndarray, src: int = 0, group: GroupArg = None,
              async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Copy ``array`` of global rank ``src`` into ``array`` on every rank of the group."""
    return _run(door().plan.prepare_broadcast(array, src, group, algorithm), async_op)


def barrier(group: GroupArg = None, async_op: bool = False) -> Work | None:
    """Return once every rank of the group has entered the barrier."""
    return _run(door().plan.prepare_barrier(group), async_op)


def reduce(array: np.ndarray, dst: int = 0, op: ReduceOp = ReduceOp.SUM,
           group: GroupArg = None, async_op: bool = False,
           algorithm: str | None = None) -> Work | None:
    """Reduce ``array`` across the group into ``array`` on global rank ``dst`` (in place);
    the other ranks' arrays are left as they were."""
    return _run(door().plan.prepare_reduce(array, dst, op, group, algorithm), async_op)


def all_gather(output: np.ndarray, input: np.ndarray, group: GroupArg = None,
               async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Concatenate every rank's ``input`` into ``output``, in group-rank order
    (``output.size == input.size * group size``; like torch's all_gather_into_tensor)."""
    return _run(door().plan.prepare_all_gather(output, input, group, algorithm), async_op)


def reduce_scatter(output: np.ndarray, input: np.ndarray, op: ReduceOp = ReduceOp.SUM,
                   group: GroupArg = None, async_op: bool = False,
                   algorithm: str | None = None) -> Work | None:
    """Reduce ``input`` (group size x ``output.size`` elements) across the group and
    give group rank ``i`` block ``i`` of the result in ``output``."""
    return _run(door().plan.prepare_reduce_scatter(output, input, op, group, algorithm),
                async_op)


def gather(input: np.ndarray, output: np.ndarray | None = None, dst: int = 0,
           group: GroupArg = None, async_op: bool = False,
           algorithm: str | None = None) -> Work | None:
    """Concatenate every rank's ``input`` into ``output`` on global rank ``dst`` only."""
    return _rooted("gather", output, input, dst, group, async_op, algorithm)


def scatter(output: np.ndarray, input: np.ndarray | None = None, src: int = 0,
            group: GroupArg = None, async_op: bool = False,
            algorithm: str | None = None) -> Work | None:
    """Give group rank ``i`` block ``i`` of ``input`` (on global rank ``src``) in ``output``."""
    return _rooted("scatter", output, input, src, group, async_op, algorithm)


def _rooted(kind: str, output: Any, input: Any, root: int, group: GroupArg, async_op: bool,
            algorithm: str | None) -> Work | None:
    """A scatter or gather; a blocking one that repeats the last such call runs planned
    once (:mod:`minidist.fast_repeat`), and one that took the fast path is remembered."""
    blocking = not async_op and algorithm is None
    if blocking and fast_repeat.again(STATE.blocking, kind, output, input, root, group):
        return None
    d = door()
    item = d.plan.prepare_scatter(output, input, root, group, algorithm) \
        if kind == "scatter" else d.plan.prepare_gather(input, output, root, group, algorithm)
    if not blocking:
        return _run(item, async_op)
    d.wait(item)
    fast_repeat.remember(d, item, group, output, input)
    return None


def all_to_all(output: np.ndarray, input: np.ndarray, group: GroupArg = None,
               async_op: bool = False, algorithm: str | None = None) -> Work | None:
    """Block ``j`` of ``input`` goes to group rank ``j``; block ``i`` of ``output`` comes
    from group rank ``i`` (equal blocks)."""
    return _run(door().plan.prepare_all_to_all(output, input, group, algorithm), async_op)


def _generated(name: str, array: np.ndarray, op: ReduceOp, group: GroupArg, async_op: bool,
               algorithm: str | None) -> Work | None:
    return _run(door().plan.prepare_collective(name, array, op, group, algorithm), async_op)


GENERATED: dict[str, Any] = {
    rec.front.function: facade.define(rec, _generated, __name__) for rec in facade.records()}
"""The functions of the collectives whose records carry a front end (minidist.scan, ...)."""
globals().update(GENERATED)


# ---------------------------------------------------------------------- point-to-point


def isend(array: np.ndarray, dst: int, tag: int = 0, group: GroupArg = None) -> Work:
    """Send ``array`` to global rank ``dst``; the Work completes once it is on its way.

    Messages between two ranks with the same tag arrive in the order they were sent.
    """
    d = door()
    return Work(d.submit(d.plan.prepare_send(array, dst, tag, group)))


def send(array: np.ndarray, dst: int, tag: int = 0, group: GroupArg = None) -> None:
    """Blocking :func:`isend`."""
    d = door()
    d.wait(d.plan.prepare_send(array, dst, tag, group))


def irecv(array: np.ndarray, src: int | None = None, tag: int = 0,
          group: GroupArg = None) -> Work:
    """Receive the next message from global rank ``src`` with ``tag`` into ``array``;
    ``src`` None: the first message with ``tag`` to arrive from any rank of the group
    (fair: in order of arrival; each sender's messages still in order). The Work's
    ``source_rank()`` is the sender.

    CollectiveMismatchError if its shape or dtype differs (``array`` is then left as it
    was); DistTimeoutError if nothing comes before the timeout.
    """
    d = door()
    item = d.plan.prepare_recv(array, src, tag, group)
    return Work(d.submit(item), source=lambda: item.source)


def recv(array: np.ndarray, src: int | None = None, tag: int = 0,
         group: GroupArg = None) -> int:
    """Blocking :func:`irecv`; returns the sender's global rank (as torch does)."""
    d = door()
    item = d.plan.prepare_recv(array, src, tag, group)
    d.wait(item)
    return item.source


def recv_many(output: np.ndarray, src: int | Sequence[int] | None = None, tag: int = 0,
              group: GroupArg = None, async_op: bool = False) -> np.ndarray | Work:
    """Receive the first ``k = output.shape[0]`` messages to arrive, each of the shape
    ``output.shape[1:]`` and dtype of ``output``, from ``src`` (None: any other rank of
    the group; a global rank; or a sequence of them) with ``tag``: ``output[i]`` gets
    the ``i``-th to arrive. Returns the k senders (global ranks, an int64 array) in that
    order; with ``async_op``, a Work whose ``result()`` they are.

    Each sender's messages are taken in their order, as :func:`recv` with ``src=None``
    takes them; a message is taken whole or not at all, and the ones not taken wait for
    the next receive. CollectiveMismatchError names a message that does not fit (the
    others this call took wait for the next receive); PeerLostError names a rank of
    ``src`` that died or left; DistTimeoutError after the group's timeout.
    """
    d = door()
    m = d.plan_many(output, src, tag, group)
    if async_op:
        return Work(d.submit_many(m))
    return d.wait_many(m)


def send_object(obj: Any, dst: int, tag: int = 0, group: GroupArg = None) -> None:
    """Send any picklable object to global rank ``dst`` (like mpi4py's ``send``)."""
    d = door()
    d.wait(d.plan.prepare_send(objects.dumps(obj), dst, tag, group, is_object=True))


def recv_object(src: int | None = None, tag: int = 0, group: GroupArg = None,
                return_source: bool = False) -> Any:
    """Receive the next object sent by global rank ``src`` (None: by any rank) with
    ``tag``. With ``return_source``, return ``(obj, sender's global rank)``."""
    d = door()
    item = d.plan.prepare_recv(None, src, tag, group)
    obj = objects.loads(d.wait(item))
    return (obj, item.source) if return_source else obj


def isend_object(obj: Any, dst: int, tag: int = 0, group: GroupArg = None) -> Work:
    """Start sending a picklable object to global rank ``dst``."""
    d = door()
    return Work(d.submit(d.plan.prepare_send(objects.dumps(obj), dst, tag, group,
                                             is_object=True)))


def irecv_object(src: int | None = None, tag: int = 0, group: GroupArg = None) -> Work:
    """Start receiving the next object from ``src`` (None: any rank); the Work's
    ``result()`` is the object and its ``source_rank()`` the sender."""
    d = door()
    item = d.plan.prepare_recv(None, src, tag, group)
    raw = d.submit(item)
    done: concurrent.futures.Future = concurrent.futures.Future()

    def unpickle(f: concurrent.futures.Future) -> None:
        if f.cancelled() or f.exception() is not None:
            done.set_exception(f.exception() or concurrent.futures.CancelledError())
            return
        try:
            done.set_result(objects.loads(f.result()))
        except Exception as e:  # noqa: BLE001 - an object that does not unpickle
            done.set_exception(e)

    raw.add_done_callback(unpickle)
    return Work(done, source=lambda: item.source)


def iprobe(src: int | None = None, tag: int = 0, group: GroupArg = None) -> int | None:
    """The sender of the message a receive from ``src`` (None: any rank) with ``tag``
    would take now, without receiving it; None if none has arrived (never waits)."""
    d = door()
    return d.block(d.probe(src, tag, group, wait=False))


def probe(src: int | None = None, tag: int = 0, group: GroupArg = None) -> int:
    """Like :func:`iprobe`, but wait (up to the timeout) until such a message arrives."""
    d = door()
    return d.block(d.probe(src, tag, group, wait=True))


# ---------------------------------------------------------------------- objects


def broadcast_object(obj: Any, src: int = 0, group: GroupArg = None) -> Any:
    """``obj`` of global rank ``src``, on every rank of the group (pickled)."""
    d = door()
    return d.block(objects.broadcast_object(d, obj, src, group))


def all_gather_object(obj: Any, group: GroupArg = None) -> list[Any]:
    """Every rank's ``obj``, in group-rank order, on every rank (pickled)."""
    d = door()
    return d.block(objects.all_gather_object(d, obj, group))


def gather_object(obj: Any, dst: int = 0, group: GroupArg = None) -> list[Any] | None:
    """Every rank's ``obj`` in group-rank order on global rank ``dst``; None elsewhere."""
    d = door()
    return d.block(objects.gather_object(d, obj, dst, group))


def scatter_object(objs: list[Any] | None, src: int = 0, group: GroupArg = None) -> Any:
    """Object ``i`` of ``objs`` (given on global rank ``src``) on group rank ``i``."""
    d = door()
    return d.block(objects.scatter_object(d, objs, src, group))


# ---------------------------------------------------------------------- store


def get_store() -> Store:
    """The job's key/value store."""
    return Store(door())
