"""Planning a call: argument checks, numbering, the plan cache.

Pure: no socket, no event loop. A :class:`Planner` runs on the caller's thread, in call
order; what it returns (a :class:`Prepared` collective or a :class:`P2P` message, records
defined in :mod:`minidist.prepared`) is what the door starts and the session executes.
Everything a bad argument can break is checked here, before anything is numbered or
sent. Which calls take the fast path, and how, is :mod:`minidist.shm.planner`'s; the
algorithm and schedule of the others is :mod:`minidist.socket_plan`'s; where the ranks
are, :mod:`minidist.placement`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from . import collectives, ops, wire
from .algorithms import SCHEDULE_KEEP_OPS
from .algorithms.schedule import Schedule
from .errors import NotInGroupError
from .group import NON_GROUP_MEMBER, WORLD_ID, Group, group_id
from .ops import ReduceOp
from .placement import Placement
from .prepared import P2P, P2P_TAG_LIMIT, Call, Prepared
from .shm.planner import FastPlanner
from .socket_plan import SocketPlanner

log = logging.getLogger("minidist.plan")

FAST_KINDS = (wire.Kind.ALL_REDUCE, wire.Kind.BROADCAST, wire.Kind.BARRIER, wire.Kind.SCATTER,
              wire.Kind.GATHER, wire.Kind.ALL_GATHER)  # see shm.fast_slots, shm.rooted_area
PLAN_CACHE = 4096  # calls whose algorithm and schedule a session remembers


class Planner:
    """Plans the calls of one rank. ``number(group)`` and ``number_p2p(group, peer, tag,
    sending)`` hand out call numbers (the engine's counters); ``costs`` is the cost
    model's calibration; ``shm_enabled`` whether shared memory may be used; ``forced``
    the per-job algorithm overrides (collective -> name; ``forced`` keeps the dict, read
    by both planners below). ``fast_planner`` plans the calls that take the fast path,
    ``socket_planner`` the others; ``placement`` says where the ranks are."""

    def __init__(self, rank: int, world_size: int,
                 number: Callable[[Group], int],
                 number_p2p: Callable[[Group, int, int, bool], int],
                 shm_enabled: bool, costs: object, forced: dict[str, str]) -> None:
        self.rank = rank
        self.world = Group(WORLD_ID, tuple(range(world_size)), "world")
        # what collectives with group=None run on: the world, or what shrinking it left
        # (messages with group=None keep the world: any two ranks may talk)
        self.default = self.world
        self.incarnations = [0] * world_size  # restarts of each rank (minidist.elastic)
        self.placement = Placement(world_size)
        self._number_p2p = number_p2p
        self.forced = forced
        self.fast_planner = FastPlanner(self.placement, number, forced)
        self.socket_planner = SocketPlanner(rank, self.placement, shm_enabled, costs, forced)
        # per call: the fast planner's own method, and the engine's counter
        self._prepare_fast = self.fast_planner.prepare
        self._number = number
        self._group_counts: dict[tuple[int, ...], int] = {}
        self._plans: dict[tuple, tuple] = {}
        self.fast = False  # calls that fit take the fast path (shm.fast_slots.takes)
        self._digests: dict[tuple[int, ...], int] = {}
        self._fast_plans: dict[tuple, tuple] = {}  # see FastPlanner.plan

    def set_nodes(self, nodes: list[int], read_keys: list[str | None] | None = None) -> None:
        """The node index of every rank (from the rendezvous' welcome), and what each
        must share with another to read its memory (:func:`minidist.peer_memory.key`;
        None: it cannot)."""
        self.placement.set(nodes, read_keys)
        self._fast_plans.clear()

    @property
    def nodes(self) -> list[int]:
        """The node index of every rank."""
        return self.placement.nodes

    @property
    def shm_enabled(self) -> bool:
        """Whether calls may use shared memory (the ``shared_memory`` algorithm)."""
        return self.socket_planner.shm_enabled

    @shm_enabled.setter
    def shm_enabled(self, enabled: bool) -> None:
        self.socket_planner.shm_enabled = enabled

    def can_read(self, g: Group) -> bool:
        """Whether every rank of ``g`` said it can read the others' memory (their keys,
        :func:`minidist.peer_memory.key`, are equal)."""
        return self.placement.can_read(g)

    # ------------------------------------------------------------------ groups

    def new_group(self, ranks: list[int] | None = None,
                  timeout: float | None = None) -> Group | object:
        """See :func:`minidist.new_group`."""
        timeout = _timeout(timeout)
        members = _members(ranks, self.world.size)
        incs = tuple(self.incarnations[r] for r in members)
        # numbered per incarnation of the members: a restarted rank and the ranks that
        # stayed make the same group whatever groups each made before
        counted = (members, incs) if any(incs) else members
        ordinal = self._group_counts.get(counted, 0)
        self._group_counts[counted] = ordinal + 1
        if self.rank not in members:
            return NON_GROUP_MEMBER
        return Group(group_id(members, ordinal, incs), members, timeout=timeout,
                     incarnations=incs if any(incs) else ())

    def group(self, group: Group | object | None, what: str) -> Group:
        """The group a call runs on; NotInGroupError if this rank is not a member."""
        if group is None:
            return self.world if what in ("send", "recv", "probe") else self.default
        if group is NON_GROUP_MEMBER:
            raise NotInGroupError(f"{what}: rank {self.rank} is not a member of this group")
        if not isinstance(group, Group):
            raise TypeError(f"{what}: group must be a minidist group or None, "
                            f"not {type(group).__name__}")
        if self.rank not in group:
            raise NotInGroupError(f"{what}: rank {self.rank} is not in {group!r}")
        return group

    # ------------------------------------------------------------------ preparing calls

    def prepare_all_reduce(self, array: np.ndarray, op: ReduceOp, group: object,
                           algorithm: str | None) -> Prepared:
        g = self.group(group, "all_reduce")
        user, flat = _flat(array, "all_reduce")
        op = ops.as_op(op)
        ops.check_op(op, flat.dtype)
        return self._prepare(wire.Kind.ALL_REDUCE, g, user, flat, op, -1, algorithm, True)

    def prepare_broadcast(self, array: np.ndarray, src: int, group: object,
                          algorithm: str | None) -> Prepared:
        g = self.group(group, "broadcast")
        if src not in g:
            raise ValueError(f"broadcast: src {src} is not a member of {g!r}")
        array = as_array(array, "broadcast")
        if self.rank == src and not array.flags.writeable:
            # the source is only read: a private copy lets the schedule use it as a buffer
            user, flat = None, np.array(array, copy=True).reshape(-1)
            ops.dtype_code(flat.dtype)
            return self._prepare(wire.Kind.BROADCAST, g, array, flat, ReduceOp.SUM, src,
                                 algorithm, False, copy_back=False)
        user, flat = _flat(array, "broadcast")
        return self._prepare(wire.Kind.BROADCAST, g, user, flat, ReduceOp.SUM, src, algorithm,
                             False)

    def prepare_barrier(self, group: object) -> Prepared:
        g = self.group(group, "barrier")
        flat = np.empty(0, np.uint8)
        return self._prepare(wire.Kind.BARRIER, g, flat, flat, ReduceOp.SUM, -1, None, False)

    def prepare_reduce(self, array: np.ndarray, dst: int, op: ReduceOp, group: object,
                       algorithm: str | None) -> Prepared:
        g = self.group(group, "reduce")
        _member(g, dst, "reduce", "dst")
        user, flat = _flat(array, "reduce")
        op = ops.as_op(op)
        ops.check_op(op, flat.dtype)
        return self._prepare(wire.Kind.REDUCE, g, user, flat, op, dst, algorithm,
                             finish=self.rank == dst)

    def prepare_all_gather(self, output: np.ndarray, input: np.ndarray, group: object,
                           algorithm: str | None) -> Prepared:
        g = self.group(group, "all_gather")
        out_user, out = _flat(output, "all_gather (output)")
        inp = _flat_in(input, "all_gather (input)", out.dtype)
        _sizes("all_gather", out.size, inp.size * g.size, "output", "input x group size")
        return self._prepare(wire.Kind.ALL_GATHER, g, out_user, out, ReduceOp.SUM, -1,
                             algorithm, False, inp=inp, count=inp.size,
                             shape=np.shape(input))

    def prepare_reduce_scatter(self, output: np.ndarray, input: np.ndarray, op: ReduceOp,
                               group: object, algorithm: str | None) -> Prepared:
        g = self.group(group, "reduce_scatter")
        out_user, out = _flat(output, "reduce_scatter (output)")
        inp = _flat_in(input, "reduce_scatter (input)", out.dtype)
        _sizes("reduce_scatter", inp.size, out.size * g.size, "input", "output x group size")
        op = ops.as_op(op)
        ops.check_op(op, out.dtype)
        return self._prepare(wire.Kind.REDUCE_SCATTER, g, out_user, out, op, -1, algorithm,
                             True, inp=inp, count=out.size)

    def prepare_gather(self, input: np.ndarray, output: np.ndarray | None, dst: int,
                       group: object, algorithm: str | None) -> Prepared:
        g = self.group(group, "gather")
        _member(g, dst, "gather", "dst")
        inp = _flat_in(input, "gather (input)", None)
        shape = input.shape if type(input) is np.ndarray else np.shape(input)
        if self.rank == dst:
            if output is None:
                raise ValueError("gather: the dst rank must pass an output array")
            out_user, out = _flat(output, "gather (output)")
            _dtypes("gather", out.dtype, inp.dtype)
            _sizes("gather", out.size, inp.size * g.size, "output", "input x group size")
        else:
            out_user = out = inp[:0]
        return self._prepare(wire.Kind.GATHER, g, out_user, out, ReduceOp.SUM, dst,
                             algorithm, False, inp=inp, count=inp.size, shape=shape)

    def prepare_scatter(self, output: np.ndarray, input: np.ndarray | None, src: int,
                        group: object, algorithm: str | None) -> Prepared:
        g = self.group(group, "scatter")
        _member(g, src, "scatter", "src")
        out_user, out = _flat(output, "scatter (output)")
        if self.rank == src:
            if input is None:
                raise ValueError("scatter: the src rank must pass an input array")
            inp = _flat_in(input, "scatter (input)", out.dtype)
            _sizes("scatter", inp.size, out.size * g.size, "input", "output x group size")
        else:
            inp = out[:0]
        return self._prepare(wire.Kind.SCATTER, g, out_user, out, ReduceOp.SUM, src,
                             algorithm, False, inp=inp, count=out.size)

    def prepare_all_to_all(self, output: np.ndarray, input: np.ndarray, group: object,
                           algorithm: str | None) -> Prepared:
        g = self.group(group, "all_to_all")
        out_user, out = _flat(output, "all_to_all (output)")
        inp = _flat_in(input, "all_to_all (input)", out.dtype)
        _sizes("all_to_all", out.size, inp.size, "output", "input")
        if inp.size % g.size:
            raise ValueError(f"all_to_all: {inp.size} elements do not split into "
                             f"{g.size} equal blocks")
        return self._prepare(wire.Kind.ALL_TO_ALL, g, out_user, out, ReduceOp.SUM, -1,
                             algorithm, False, inp=inp, count=inp.size // g.size,
                             shape=np.shape(input))

    def prepare_collective(self, name: str, array: np.ndarray, op: ReduceOp, group: object,
                           algorithm: str | None) -> Prepared:
        """A call of a collective with a generated front end (see
        :mod:`minidist.facade`): ``array`` is the input and receives the result."""
        rec = collectives.get(name)
        g = self.group(group, name)
        user, flat = _flat(array, name)
        op = ops.as_op(op)
        if rec.reducing:
            ops.check_op(op, flat.dtype)
            if op.name in rec.refused_ops:
                raise ValueError(f"{name} does not take ReduceOp.{op.name}")
        kind = wire.Kind[name.upper()]
        first = g.rank_of(self.rank) == 0
        if rec.in_place or g.size == 1:
            if g.size == 1 and rec.identity_first:
                user[...] = ops.identity(op, flat.dtype)
            return self._prepare(kind, g, user, flat, op, -1, algorithm, rec.finish != "none")
        # the result goes to a buffer of its own (the caller's array is only read until
        # the call has succeeded), then into the caller's array
        out = np.empty_like(flat)
        if rec.identity_first and first:
            out[...] = ops.identity(op, flat.dtype)
        p = self._prepare(kind, g, out, out, op, -1, algorithm, rec.finish != "none",
                          inp=flat, count=flat.size, shape=user.shape)
        p.user = user
        return p

    def _prepare(self, kind: wire.Kind, g: Group, user: np.ndarray, flat: np.ndarray,
                 op: ReduceOp, root: int, algorithm: str | None, finish: bool,
                 inp: np.ndarray | None = None, count: int | None = None,
                 shape: tuple[int, ...] | None = None, copy_back: bool = True) -> Prepared:
        copied = user if copy_back and not user.flags.c_contiguous else None
        count = flat.size if count is None else count
        bufs = {"out": flat, "in": flat if inp is None else inp}
        if g.size == 1:
            if inp is not None and flat.size:
                np.copyto(flat, inp)
            return Prepared(None, None, bufs, op, copied, finish)
        shape = user.shape if shape is None else shape
        if self.fast and algorithm is None and kind in FAST_KINDS:
            fkey = (kind, g.id, flat.dtype, count, shape)
            fast = self._fast_plans.get(fkey)
            if fast is None:
                fast = self.fast_planner.plan(kind, g, flat.dtype, count, shape)
                if len(self._fast_plans) > PLAN_CACHE:
                    self._fast_plans.clear()
                self._fast_plans[fkey] = fast
            if fast:
                return self._prepare_fast(kind, g, bufs, op, root, count, copied, finish,
                                          fast)
        key = (kind, g.id, flat.dtype, count, bufs["in"].size, shape, root, algorithm)
        plan = self._plans.get(key)
        if plan is None:
            plan = self.socket_planner.plan(kind, g, flat, bufs["in"], count, shape, root,
                                            algorithm)
            if plan[3].operations <= SCHEDULE_KEEP_OPS:  # (else: planned anew each call)
                if len(self._plans) > PLAN_CACHE:
                    self._plans.clear()
                self._plans[key] = plan
        name, index, digest, sched, code = plan
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s on %r: %s (%d elements of %s)", kind.name.lower(), g, name, count,
                      flat.dtype)
        call = Call(kind, g, self._number(g), code, int(op), index, name, root, count,
                    digest)
        return Prepared(call, sched, bufs, op, copied, finish)

    def socket_schedule(self, call: Call, bufs: dict[str, np.ndarray]) -> Schedule:
        """The schedule ``call`` (planned for shared memory) runs instead when its group
        has no shared memory to use (:meth:`SocketPlanner.schedule`)."""
        return self.socket_planner.schedule(call, bufs)

    # ------------------------------------------------------------------ messages

    def prepare_send(self, array: np.ndarray | bytes, dst: int, tag: int, group: object,
                     is_object: bool = False, internal: bool = False) -> P2P:
        """A message to global rank ``dst``. ``internal`` tags (2**31 and up) belong to
        layers built on minidist (the torch adapter), never to users."""
        g = self.group(group, "send")
        peer = self._peer(g, dst, "send", "dst")
        if is_object:
            flat, shape = np.frombuffer(array, np.uint8), (len(array),)
        else:
            flat = _flat_in(array, "send", None)
            shape = array.shape if type(array) is np.ndarray else np.shape(array)
        tag = _tag(tag, internal)
        return P2P(g, peer, tag, self._number_p2p(g, peer, tag, True), flat,
                   wire.shape_digest(shape) if is_object else self._digest(shape),
                   is_object, sending=True)

    def prepare_recv(self, array: np.ndarray | None, src: int | None, tag: int,
                     group: object, internal: bool = False) -> P2P:
        """A receive from global rank ``src`` (None: from any rank of the group) into
        ``array`` (None: an object). A receive from any rank is numbered when its
        message arrives, so it has no number yet (-1)."""
        g = self.group(group, "recv")
        peer = -1 if src is None else self._peer(g, src, "recv", "src")
        if src is None and g.size < 2:
            raise ValueError(f"recv: src=None on {g!r}, which has no other rank")
        tag = _tag(tag, internal)
        seq = -1 if src is None else self._number_p2p(g, peer, tag, False)
        if array is None:  # an object: any size
            return P2P(g, peer, tag, seq, None, 0, True)
        user, flat = _flat(array, "recv")
        return P2P(g, peer, tag, seq, flat, self._digest(user.shape), False,
                   user if not user.flags.c_contiguous else None)

    def check_probe(self, src: int | None, tag: int, group: object) -> tuple[Group, int]:
        """(the group, the tag) of a probe for a message from ``src`` (None: any)."""
        g = self.group(group, "probe")
        if src is not None:
            self._peer(g, src, "probe", "src")
        return g, _tag(tag)

    def _digest(self, shape: tuple[int, ...]) -> int:
        """:func:`wire.shape_digest` of an array's shape, remembered."""
        digest = self._digests.get(shape)
        if digest is None:
            if len(self._digests) > PLAN_CACHE:
                self._digests.clear()
            digest = self._digests[shape] = wire.shape_digest(shape)
        return digest

    def _peer(self, g: Group, rank: int, what: str, name: str) -> int:
        _member(g, rank, what, name)
        if rank == self.rank:
            raise ValueError(f"{what}: {name}={rank} is this rank itself")
        return rank


_KDL_CPU = 1  # DLPack's device type for host memory


def as_array(obj: object, what: str) -> np.ndarray:
    """``obj`` as a numpy array, without a copy: a numpy array as it is; else anything
    with ``__dlpack__`` in CPU memory (a CPU torch tensor), ``__array__``, or the
    buffer protocol. TypeError, naming ``what``, for anything else (a GPU tensor, a
    list)."""
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__dlpack_device__"):
        try:
            device = obj.__dlpack_device__()[0]
        except Exception:  # noqa: BLE001 - any failure means "not a usable tensor"
            device = None
        if device != _KDL_CPU:
            raise TypeError(f"{what} needs an array in CPU memory, not a "
                            f"{type(obj).__name__} on device {device} (CUDA tensors go "
                            "through minidist.torch)")
        try:
            return np.from_dlpack(obj)
        except (TypeError, BufferError, RuntimeError, ValueError) as e:
            raise TypeError(f"{what}: cannot view a {type(obj).__name__} as a numpy array "
                            f"({e})") from None
    if hasattr(obj, "__array__") or hasattr(obj, "__array_interface__"):
        return np.asarray(obj)
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        raise TypeError(f"{what} needs a numpy array (or an object with the buffer "
                        f"protocol, __array__ or __dlpack__), not {type(obj).__name__}") \
            from None


def _flat_in(array: object, what: str, dtype: np.dtype | None) -> np.ndarray:
    """A flat C-contiguous view (or copy) of an array that is only read."""
    array = as_array(array, what)
    ops.dtype_code(array.dtype)
    if dtype is not None:
        _dtypes(what, dtype, array.dtype)
    if array.flags.c_contiguous:
        return array.reshape(-1)
    return np.ascontiguousarray(array).reshape(-1)


def _dtypes(what: str, a: np.dtype, b: np.dtype) -> None:
    if a != b:
        raise TypeError(f"{what}: the output is {a} but the input is {b}")


def _sizes(what: str, got: int, want: int, a: str, b: str) -> None:
    if got != want:
        raise ValueError(f"{what}: {a} has {got} elements but {b} is {want}")


def _member(g: Group, rank: int, what: str, name: str) -> None:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"{what}: {name} must be a global rank (int), not {rank!r}")
    if rank not in g:
        raise ValueError(f"{what}: {name}={rank} is not a member of {g!r}")


def _tag(tag: int, internal: bool = False) -> int:
    """A user tag (0..2**31-1), or with ``internal`` one of minidist's own (2**31..2**32-1)."""
    lo, hi = (P2P_TAG_LIMIT, 1 << 32) if internal else (0, P2P_TAG_LIMIT)
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not lo <= tag < hi:
        raise ValueError(f"tag must be an int in {lo}..{hi - 1}, not {tag!r}")
    return int(tag)


def _flat(array: object, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(the caller's array, a flat C-contiguous array to work on): the same memory when
    the caller's array is contiguous, a copy otherwise."""
    array = as_array(array, what)
    ops.dtype_code(array.dtype)
    if not array.flags.writeable:
        raise ValueError(f"{what} writes into its array, which is read-only")
    if array.flags.c_contiguous:
        return array, array.reshape(-1)
    return array, np.ascontiguousarray(array).reshape(-1)


def _timeout(timeout: object) -> float | None:
    """A group's timeout in seconds (None: the job's); a timedelta is accepted."""
    if timeout is None:
        return None
    if hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, not {timeout!r}")
    return float(timeout)


def _members(ranks: object, world_size: int) -> tuple[int, ...]:
    """The sorted global ranks of a new group (all of them for None); ValueError for a
    rank outside the world, a duplicate, or something that is not a rank."""
    if ranks is None:
        return tuple(range(world_size))
    given = np.asarray(list(ranks))
    if given.size == 0:
        return ()
    if given.ndim != 1 or given.dtype.kind not in "iu":
        bad = next((r for r in given.ravel().tolist()
                    if isinstance(r, bool) or not isinstance(r, int)), given)
        raise ValueError(f"new_group: rank {bad!r} is not an integer rank")
    members = np.sort(given)
    if members[0] < 0 or members[-1] >= world_size:
        bad = members[0] if members[0] < 0 else members[-1]
        raise ValueError(f"new_group: rank {int(bad)} is outside 0..{world_size - 1}")
    if members.size > 1 and np.any(members[1:] == members[:-1]):
        dup = int(members[1:][members[1:] == members[:-1]][0])
        raise ValueError(f"new_group: duplicate ranks in {list(ranks)} (rank {dup})")
    return tuple(members.tolist())
