"""Planning a call: argument checks, numbering, algorithm choice, the plan cache.

Pure: no socket, no event loop. A :class:`Planner` runs on the caller's thread, in call
order; what it returns (a :class:`Prepared` collective or a :class:`P2P` message) is
what the door starts and the session executes. Everything a bad argument can break is
checked here, before anything is numbered or sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import algorithms, collectives, fast_rooted, fastpath, ops, wire
from .algorithms import cost
from .algorithms import shm as shm_algorithm
from .algorithms.schedule import Schedule
from .errors import NotInGroupError
from .group import NON_GROUP_MEMBER, WORLD_ID, Group, group_id
from .ops import ReduceOp

log = logging.getLogger("minidist.plan")


class Call(NamedTuple):
    """What one collective call looks like on this rank; frames carry it so that ranks
    that called different things find out from the first frame. (A named tuple: as
    immutable as a frozen dataclass, and made in a seventh of the time, once per call.)"""

    kind: wire.Kind
    group: Group
    seq: int
    dtype: int
    op: int
    algorithm: int
    algorithm_name: str
    root: int  # global rank, -1 if none
    count: int
    shape: int

    @property
    def name(self) -> str:
        return self.kind.name.lower()

    def describe(self, h: wire.Header | None = None) -> str:
        """The call as a user would write it (or as the frame ``h`` says its sender did)."""
        if h is None:
            kind, dtype, op, root, count, algo = (self.kind, self.dtype, self.op, self.root,
                                                  self.count, self.algorithm)
        else:
            kind, dtype, op, root, count, algo = h.kind, h.dtype, h.op, h.root, h.count, \
                h.algorithm
        try:
            dt = str(ops.dtype_from_code(dtype))
        except ValueError:
            dt = f"code {dtype}"
        name = wire.Kind(kind).name.lower()
        parts = [f"count={count}", f"dtype={dt}"]
        if kind in (wire.Kind.ALL_REDUCE, wire.Kind.REDUCE, wire.Kind.REDUCE_SCATTER):
            parts.append(f"op={ReduceOp(op).name}")
        if root >= 0:
            parts.append(f"root={root}")
        if kind != wire.Kind.P2P:
            algo_name = self.algorithm_name if h is None and algo == FAST_INDEX \
                else algorithms.name_of(name, algo)
            parts.append(f"algorithm={algo_name!r}" if algo_name is not None
                         else f"an algorithm not registered here (wire index {algo})")
        return f"{name}({', '.join(parts)})"


@dataclass(eq=False)
class Prepared:
    """A validated call, numbered and scheduled, ready to execute."""

    call: Call | None  # None: nothing to communicate (a group of one)
    schedule: Schedule | None
    bufs: dict[str, np.ndarray]
    op: ReduceOp
    user: np.ndarray | None = None  # the caller's array when ``bufs`` hold a copy
    finish: bool = False
    sent: frozenset[int] = frozenset()  # first-step sends done from the caller's thread
    fast: int = -1  # a fast call (minidist.fastpath): its number among the group's, else -1
    fast_numbers: int = 1  # ... and how many of the group's fast-call numbers it uses
    reads: bool = False  # ... and whether it reads its peers' vectors (fastpath.reads_peers)


P2P_TAG_LIMIT = 1 << 31  # tags from 2**31 up are minidist's own
SHM_TAG = P2P_TAG_LIMIT + 1  # setting up a group's shared-memory segment
SHM_BROADCAST_MIN_BYTES = 256 * 1024
FAST_TAG = P2P_TAG_LIMIT + 2  # setting up a group's fast slots
FAST_INDEX = 254  # the "algorithm" of a fast call (no frames carry it)
FAST_KINDS = (wire.Kind.ALL_REDUCE, wire.Kind.BROADCAST, wire.Kind.BARRIER, wire.Kind.SCATTER,
              wire.Kind.GATHER, wire.Kind.ALL_GATHER)  # see fastpath, fast_rooted
PLAN_CACHE = 4096  # calls whose algorithm and schedule a session remembers


@dataclass(eq=False)
class P2P:
    """A prepared point-to-point message: to or from ``peer`` (a global rank)."""

    group: Group
    peer: int
    tag: int
    seq: int
    flat: np.ndarray | None  # None: an object of any size
    shape: int
    is_object: bool
    user: np.ndarray | None = None  # the caller's array when ``flat`` is a copy
    sending: bool = False
    source: int = -1  # a receive's sender, once it is done (``peer`` is -1: any source)


class Planner:
    """Plans the calls of one rank. ``number(group)`` and ``number_p2p(group, peer, tag,
    sending)`` hand out call numbers (the engine's counters); ``costs`` is the cost
    model's calibration; ``shm_enabled`` whether shared memory may be used; ``forced``
    the per-job algorithm overrides (collective -> name)."""

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
        self.nodes: list[int] = [0] * world_size
        self._one_node = True
        self._number = number
        self._number_p2p = number_p2p
        self.shm_enabled = shm_enabled
        self.costs = costs
        self._forced = forced
        self._group_counts: dict[tuple[int, ...], int] = {}
        self._plans: dict[tuple, tuple] = {}
        self.fast = False  # calls that fit take the fast path (fastpath.takes)
        self._fast_calls: dict[int, int] = {}
        self._digests: dict[tuple[int, ...], int] = {}
        self._layouts: dict[int, tuple[int, ...]] = {}
        self._read_keys: list[str | None] = [None] * world_size
        self._reads: dict[int, bool] = {}
        self._fast_plans: dict[tuple, tuple] = {}  # see _fast_plan

    def set_nodes(self, nodes: list[int], read_keys: list[str | None] | None = None) -> None:
        """The node index of every rank (from the rendezvous' welcome), and what each
        must share with another to read its memory (:func:`minidist.peer_memory.key`;
        None: it cannot)."""
        self.nodes = list(nodes)
        self._one_node = max(self.nodes) == 0
        self._layouts.clear()
        if read_keys is None or len(read_keys) != len(self.nodes):
            read_keys = [None] * len(self.nodes)
        self._read_keys = list(read_keys)
        self._reads.clear()
        self._fast_plans.clear()

    def _can_read(self, g: Group) -> bool:
        """Whether the ranks of ``g`` (on one node) can read each other's memory."""
        ok = self._reads.get(g.id)
        if ok is None:
            keys = {self._read_keys[r] for r in g.ranks}
            ok = self._reads[g.id] = len(keys) == 1 and None not in keys
        return ok

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
        if self.rank == dst:
            if output is None:
                raise ValueError("gather: the dst rank must pass an output array")
            out_user, out = _flat(output, "gather (output)")
            _dtypes("gather", out.dtype, inp.dtype)
            _sizes("gather", out.size, inp.size * g.size, "output", "input x group size")
        else:
            out_user = out = np.empty(0, inp.dtype)
        return self._prepare(wire.Kind.GATHER, g, out_user, out, ReduceOp.SUM, dst,
                             algorithm, False, inp=inp, count=inp.size,
                             shape=np.shape(input))

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
            inp = np.empty(0, out.dtype)
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
                fast = self._fast_plan(kind, g, flat.dtype, count, shape)
                if len(self._fast_plans) > PLAN_CACHE:
                    self._fast_plans.clear()
                self._fast_plans[fkey] = fast
            if fast:
                return self._prepare_fast(kind, g, bufs, op, root, count, copied, finish,
                                          fast)
        key = (kind, g.id, flat.dtype, count, bufs["in"].size, shape, root, algorithm)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(kind, g, flat, bufs["in"], count, shape, root, algorithm)
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

    def _fast_plan(self, kind: wire.Kind, g: Group, dtype: np.dtype, count: int,
                   shape: tuple[int, ...]) -> tuple:
        """How a call takes the fast path, ``(dtype code, shape digest, reads, numbers
        used, algorithm name)``, or ``()`` when it does not (the same for every call
        of this kind, group, dtype, count and shape)."""
        collective = kind.name.lower()
        nbytes = count * dtype.itemsize
        direct = self._can_read(g)
        rooted = fast_rooted.takes(collective, g.size, nbytes)
        if not ((rooted or fastpath.takes(collective, g.size, nbytes, direct))
                and collective not in self._forced
                and (self._one_node or len(set(self._layout(g))) == 1)):
            return ()
        digest = self._digest(shape)
        reads = fastpath.reads_peers(collective, nbytes, direct, g.size)
        uses = 1 if rooted else fastpath.numbers(nbytes, dtype.itemsize, reads, g.size,
                                                 collective)
        name = "single_copy" if reads else "shared_slots"
        return ops.dtype_code(dtype), digest, reads, uses, name

    def _prepare_fast(self, kind: wire.Kind, g: Group, bufs: dict[str, np.ndarray],
                      op: ReduceOp, root: int, count: int, copied: np.ndarray | None,
                      finish: bool, fast: tuple) -> Prepared:
        """A call on one node through the group's shared slots, by the caller's thread
        (:mod:`minidist.fastpath`), numbered among the group's fast calls; ``fast``:
        what :meth:`_fast_plan` said of it."""
        code, digest, reads, uses, name = fast
        f = self._fast_calls.get(g.id, 0)
        self._fast_calls[g.id] = f + uses
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s on %r: %s (%d elements of %s)", kind.name.lower(), g, name,
                      count, bufs["out"].dtype)
        call = Call(kind, g, self._number(g), code, int(op), FAST_INDEX, name, root, count,
                    digest)
        return Prepared(call, None, bufs, op, copied, finish, fast=f, fast_numbers=uses,
                        reads=reads)

    def can_read(self, g: Group) -> bool:
        """Whether every rank of ``g`` said it can read the others' memory (their keys,
        :func:`minidist.peer_memory.key`, are equal)."""
        return self._can_read(g)

    def socket_schedule(self, call: Call, bufs: dict[str, np.ndarray]):
        """The schedule ``call`` (planned for shared memory: the fast path, or the
        ``shared_memory`` algorithm) runs instead when its group has no shared memory to
        use: what the socket path would choose, never ``shared_memory`` (the same on
        every rank, which keeps ``call`` itself: its frames carry its algorithm)."""
        g = call.group
        return self._plan(call.kind, g, bufs["out"], bufs["in"], call.count, (), call.root,
                          None, shm=False)[3]

    def _plan(self, kind: wire.Kind, g: Group, flat: np.ndarray, inp: np.ndarray,
              count: int, shape: tuple[int, ...], root: int, algorithm: str | None,
              shm: bool | None = None):
        """(algorithm, its wire index, shape digest, schedule, dtype code) of a call
        (``shm``: whether shared memory may be used; None: if it is allowed)."""
        collective = kind.name.lower()
        instead = shm is not None  # a stand-in for a call that had to give shared memory up
        shm = self.shm_enabled if shm is None else shm
        # the same on every rank: the whole vector (for gather and scatter, the root's)
        nbytes = count * flat.itemsize * (1 if collective in algorithms.IN_PLACE else g.size)
        layout = self._layout(g)
        forced = algorithm or self._forced.get(collective)
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
            shape = np.shape(array)
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

    def _layout(self, g: Group) -> tuple[int, ...]:
        """The node of each rank of ``g``, numbered from 0 in order of appearance."""
        layout = self._layouts.get(g.id)
        if layout is None:
            if self._one_node:
                layout = (0,) * g.size
            else:
                nodes = np.asarray(self.nodes)[list(g.ranks)]
                _, first, inverse = np.unique(nodes, return_index=True, return_inverse=True)
                order = np.empty(len(first), np.int64)
                order[np.argsort(first)] = np.arange(len(first))
                layout = tuple(order[inverse].tolist())
            self._layouts[g.id] = layout
        return layout


def choose_algorithm(collective: str, size: int, nbytes: int, count: int,
                     algorithm: str | None) -> str:
    """The algorithm for a call: the one given, else the size-based default."""
    name = algorithm or algorithms.choose(collective, size, nbytes, count=count)
    if name not in algorithms.ALGORITHMS[collective]:
        algorithms.wire_index(collective, name)  # ValueError naming the known ones
    return name


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
