"""The user functions of :mod:`minidist` and :mod:`minidist.aio`: one definition of each.

A :class:`Call` holds what both front ends share: the function's name, its parameters
(the source text of its parameter list: names, annotations, defaults, keyword-only
markers), its docstring, and the one expression that checks and plans a call (``d`` is
the door). Each front end turns it into a real Python function with :func:`make`, from
its own *shape* of the call (how the planned call is run and its result returned:
``api.SHAPES``, ``aio.SHAPES``): the function's source text is put together once, at
import, and compiled, as :mod:`dataclasses` and :func:`collections.namedtuple` do. So
``help()`` and :func:`inspect.signature` show the real signature, and a call costs what
a hand-written function costs: no binding of arguments, no extra Python call.

A call whose body cannot be a shape (``init``, ``destroy``, ...) is written by hand in
its module under its definition's name, and :func:`make` gives it its docstring and
refuses to import if its parameters differ from the definition's.

Pure: no I/O; the collectives with a catalog front end (``scan``) are defined by
:mod:`minidist.facade` from their records.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# shapes both front ends know (each front end's SHAPES gives their source text)
COLLECTIVE = "collective"  # async_op: a handle of the call in flight, else done
ROOTED = "rooted"  # a collective; the blocking one repeats the last scatter/gather fast
START = "start"  # a handle of the call in flight (isend)
FINISH = "finish"  # done, nothing returned (send_object)
SEND = "send"  # FINISH; a blocking send like the last one to its rank is not planned again
START_RECV = "start_recv"  # a handle that knows the sender (irecv)
RECV = "recv"  # done, the sender's global rank returned
MANY = "many"  # recv_many: the senders, or with async_op a handle that gives them
RECV_OBJECT = "recv_object"  # the unpickled object (and with return_source its sender)
START_RECV_OBJECT = "start_recv_object"  # a handle that gives the unpickled object
LOOP = "loop"  # an awaitable of the door's loop (the door's own call of several steps)
STEPS = "steps"  # several array calls (a generator of them), each run as the front end
# runs one: the blocking API's on the caller's thread
QUERY = "query"  # a plain function in both front ends: the expression's value
BY_HAND = "by_hand"  # written in each front end's module; checked against the definition

HANDLE = "{handle}"  # in a return annotation: the front end's handle (Work, Handle)


@dataclass(frozen=True)
class Call:
    """One user function of the blocking API and :mod:`minidist.aio`. ``params`` and
    ``returns`` are source text (``{handle}`` in ``returns`` is the front end's handle
    class); ``plan`` is the expression that checks and plans the call, ``d`` being the
    door; ``aio_doc`` is the asyncio function's docstring when it says more than "see
    the blocking one"; ``root`` names a rooted call's root parameter."""

    name: str
    params: str
    shape: str
    returns: str
    doc: str
    plan: str = ""
    aio_doc: str = ""
    root: str = ""

    def annotation(self, handle: str) -> str:
        return self.returns.replace(HANDLE, handle)

    def doc_for(self, front: str) -> str:
        if front == "api":
            return self.doc
        return self.aio_doc or f"See :func:`minidist.{self.name}`."


def make(namespace: dict[str, Any], front: str, shapes: dict[str, str], handle: str,
         calls: Iterable[Call]) -> dict[str, Callable[..., Any]]:
    """Define the functions of ``calls`` that ``front`` has in ``namespace`` (a front end
    module's globals, so that their names resolve there as a hand-written function's
    do): one source text from ``shapes`` (each formatted with a call's ``name``,
    ``params``, ``returns``, ``plan`` and ``root``), compiled once. A call written by
    hand (BY_HAND) must be in ``namespace`` already: it gets its docstring, and
    TypeError if its parameters or return annotation are not the definition's.
    ``front`` is "api" or "aio" (which docstring). Returns the functions by name."""
    calls = list(calls)
    module = namespace["__name__"]
    parts = ["from __future__ import annotations\n"]
    for c in calls:
        shape = BY_HAND if c.shape == BY_HAND else shapes[c.shape]
        text = stub(c, handle) if shape == BY_HAND else shape.format(
            name=c.name, params=c.params, returns=c.annotation(handle), plan=c.plan,
            root=c.root)
        parts.append(text)
    source = "\n".join(parts)
    filename = f"<{module}.{calls[0].name} ...: made by minidist.calls>"
    # tracebacks and inspect.getsource show the made functions' lines
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    made: dict[str, Any] = {}
    by_hand = {c.name: namespace[c.name] for c in calls if c.shape == BY_HAND}
    exec(compile(source, filename, "exec", dont_inherit=True), namespace, made)  # noqa: S102
    out: dict[str, Callable[..., Any]] = {}
    for c in calls:
        fn = made[c.name]
        if c.shape == BY_HAND:
            _check(by_hand[c.name], fn, module)
            fn = by_hand[c.name]
        fn.__doc__ = c.doc_for(front)
        fn.__module__ = module
        out[c.name] = fn
    namespace.update(out)
    return out


def stub(c: Call, handle: str) -> str:
    """The source of a function with ``c``'s signature and no body."""
    return f"def {c.name}({c.params}) -> {c.annotation(handle)}:\n    pass\n"


def _check(written: Any, defined: Any, module: str) -> None:
    """TypeError if a hand-written function's parameters differ from its definition."""
    a, b = written.__code__, defined.__code__
    same = (a.co_argcount == b.co_argcount and a.co_kwonlyargcount == b.co_kwonlyargcount
            and a.co_posonlyargcount == b.co_posonlyargcount
            and a.co_varnames[:a.co_argcount + a.co_kwonlyargcount]
            == b.co_varnames[:b.co_argcount + b.co_kwonlyargcount]
            and written.__defaults__ == defined.__defaults__
            and written.__kwdefaults__ == defined.__kwdefaults__
            and written.__annotations__ == defined.__annotations__)
    if not same:
        raise TypeError(f"{module}.{written.__name__} is written by hand with parameters "
                        f"other than its definition's in minidist.calls")


def group_rank(g: Any, global_rank: int) -> int:
    """The rank of ``global_rank`` in group ``g``; ValueError if it is not a member."""
    r = g.rank_of(global_rank)
    if r < 0:
        raise ValueError(f"global rank {global_rank} is not part of {g!r}")
    return r


_COLLECTIVE = ("async_op: bool = False, algorithm: str | None = None")
_MESSAGE = "tag: int = 0, group: GroupArg = None"

CALLS: dict[str, Call] = {c.name: c for c in (
    # ------------------------------------------------------------------ lifecycle
    Call("init", "*, rank: int | None = None, world_size: int | None = None, "
         "master_addr: str | None = None, master_port: int | None = None, "
         "timeout: float | None = None", BY_HAND, "None",
         """Join the job described by the launcher's environment (or by the arguments).

    Understands ``minidist run``, torchrun, Slurm and Open MPI; with no launcher at all
    the process is a world of one. ``master_port`` given here is minidist's own
    rendezvous port. ``timeout`` (seconds; default ``MINIDIST_TIMEOUT`` or 300) bounds
    init and every later call. DistError if already initialized.
    """, aio_doc="Join the job on the running loop (arguments as :func:`minidist.init`)."),
    Call("destroy", "", BY_HAND, "None",
         "Leave the job and release every socket and thread; ``init`` may be called again.",
         aio_doc="Leave the job and close every socket; ``init`` may be awaited again."),
    Call("is_initialized", "", BY_HAND, "bool",
         "Whether this process has joined a job through the blocking API.",
         aio_doc="Whether this process has joined a job through minidist.aio."),
    # ------------------------------------------------------------------ queries and groups
    Call("get_rank", "group: GroupArg = None", QUERY, "int",
         "This process's rank in ``group`` (the world by default); -1 if not a member.",
         "d.rank_in(group)"),
    Call("get_world_size", "group: GroupArg = None", QUERY, "int",
         "The number of ranks in ``group`` (the world by default); -1 for a non-member.",
         "d.size_of(group)"),
    Call("get_local_rank", "", QUERY, "int",
         "This process's index among the processes of its node.", "d.local_rank"),
    Call("get_local_world_size", "", QUERY, "int",
         "The number of processes on this node.", "d.local_world_size"),
    Call("get_node_rank", "", QUERY, "int",
         "The index of this process's node (0 for the node of rank 0).", "d.node_rank"),
    Call("new_group", "ranks: list[int] | None = None, timeout: float | None = None, "
         "backend: str | None = None", QUERY, "Group | object",
         """A group of the given global ranks (sorted, as torch does); opens no socket.

    Members call it in the same order as each other; a non-member gets
    ``GroupMember.NON_GROUP_MEMBER``. Unlike torch.distributed, ranks need not create
    groups they are not in: a group's identity follows from its members and the order
    in which they created groups with exactly those members. ``timeout`` (seconds or a
    timedelta) bounds every call on the group instead of the job's timeout; 0 means
    "do not wait". ``backend`` is accepted for compatibility.
    """, "d.plan.new_group(ranks, timeout)",
         aio_doc="See :func:`minidist.new_group` (opens no socket, so it is not a "
                 "coroutine)."),
    Call("new_subgroups", "group_size: int | None = None, group: GroupArg = None, "
         "timeout: float | None = None, backend: str | None = None", QUERY,
         "tuple[Group | object, list[Group | object]]",
         """Split the world (or ``group``) into consecutive groups of ``group_size`` ranks
    (default: the processes per node), like torch. Returns (this rank's subgroup, all
    subgroups; NON_GROUP_MEMBER for those this rank is not in).""",
         "d.new_subgroups(group_size, group, timeout)"),
    Call("get_process_group_ranks", "group: GroupArg", QUERY, "list[int]",
         "The global ranks of ``group`` in group-rank order.",
         "list(d.group_of(group).ranks)"),
    Call("get_group_rank", "group: GroupArg, global_rank: int", QUERY, "int",
         "The rank within ``group`` of ``global_rank``; ValueError if it is not a member.",
         "calls.group_rank(d.group_of(group), global_rank)"),
    Call("get_global_rank", "group: GroupArg, group_rank: int", QUERY, "int",
         "The global rank of rank ``group_rank`` of ``group``; ValueError if out of range.",
         "d.group_of(group).global_rank(group_rank)"),
    # ------------------------------------------------------------------ collectives
    Call("all_reduce", "array: np.ndarray, op: ReduceOp = ReduceOp.SUM, "
         f"group: GroupArg = None, {_COLLECTIVE}", COLLECTIVE, "{handle} | None",
         """Reduce ``array`` across the group in place, so every rank holds the result.

    Every rank ends with bit-identical bytes. ``algorithm`` (or the environment
    variable MINIDIST_ALGO_ALL_REDUCE) overrides the size-based choice. With
    ``async_op=True`` returns a :class:`Work`; otherwise returns None when done.
    """, "d.plan.prepare_all_reduce(array, op, group, algorithm)"),
    Call("broadcast", f"array: np.ndarray, src: int = 0, group: GroupArg = None, {_COLLECTIVE}",
         COLLECTIVE, "{handle} | None",
         "Copy ``array`` of global rank ``src`` into ``array`` on every rank of the group.",
         "d.plan.prepare_broadcast(array, src, group, algorithm)"),
    Call("barrier", "group: GroupArg = None, async_op: bool = False", COLLECTIVE,
         "{handle} | None", "Return once every rank of the group has entered the barrier.",
         "d.plan.prepare_barrier(group)"),
    Call("reduce", "array: np.ndarray, dst: int = 0, op: ReduceOp = ReduceOp.SUM, "
         f"group: GroupArg = None, {_COLLECTIVE}", COLLECTIVE, "{handle} | None",
         """Reduce ``array`` across the group into ``array`` on global rank ``dst`` (in place);
    the other ranks' arrays are left as they were.""",
         "d.plan.prepare_reduce(array, dst, op, group, algorithm)"),
    Call("all_gather", "output: np.ndarray, input: np.ndarray, group: GroupArg = None, "
         f"{_COLLECTIVE}", COLLECTIVE, "{handle} | None",
         """Concatenate every rank's ``input`` into ``output``, in group-rank order
    (``output.size == input.size * group size``; like torch's all_gather_into_tensor).""",
         "d.plan.prepare_all_gather(output, input, group, algorithm)"),
    Call("reduce_scatter", "output: np.ndarray, input: np.ndarray, op: ReduceOp = ReduceOp.SUM, "
         f"group: GroupArg = None, {_COLLECTIVE}", COLLECTIVE, "{handle} | None",
         """Reduce ``input`` (group size x ``output.size`` elements) across the group and
    give group rank ``i`` block ``i`` of the result in ``output``.""",
         "d.plan.prepare_reduce_scatter(output, input, op, group, algorithm)"),
    Call("gather", "input: np.ndarray, output: np.ndarray | None = None, dst: int = 0, "
         f"group: GroupArg = None, {_COLLECTIVE}", ROOTED, "{handle} | None",
         "Concatenate every rank's ``input`` into ``output`` on global rank ``dst`` only.",
         "d.plan.prepare_gather(input, output, dst, group, algorithm)", root="dst"),
    Call("scatter", "output: np.ndarray, input: np.ndarray | None = None, src: int = 0, "
         f"group: GroupArg = None, {_COLLECTIVE}", ROOTED, "{handle} | None",
         "Give group rank ``i`` block ``i`` of ``input`` (on global rank ``src``) in ``output``.",
         "d.plan.prepare_scatter(output, input, src, group, algorithm)", root="src"),
    Call("all_to_all", "output: np.ndarray, input: np.ndarray, group: GroupArg = None, "
         f"{_COLLECTIVE}", COLLECTIVE, "{handle} | None",
         """Block ``j`` of ``input`` goes to group rank ``j``; block ``i`` of ``output`` comes
    from group rank ``i`` (equal blocks).""",
         "d.plan.prepare_all_to_all(output, input, group, algorithm)"),
    # ------------------------------------------------------------------ point-to-point
    Call("isend", f"array: np.ndarray, dst: int, {_MESSAGE}", START, "{handle}",
         """Send ``array`` to global rank ``dst``; the Work completes once it is on its way.

    Messages between two ranks with the same tag arrive in the order they were sent.
    """, "d.plan.prepare_send(array, dst, tag, group)",
         aio_doc="Start sending ``array`` to global rank ``dst``; await the handle for "
                 "completion."),
    Call("send", f"array: np.ndarray, dst: int, {_MESSAGE}", SEND, "None",
         "Blocking :func:`isend`.", "d.plan.prepare_send(array, dst, tag, group)"),
    Call("irecv", f"array: np.ndarray, src: int | None = None, {_MESSAGE}", START_RECV,
         "{handle}",
         """Receive the next message from global rank ``src`` with ``tag`` into ``array``;
    ``src`` None: the first message with ``tag`` to arrive from any rank of the group
    (fair: in order of arrival; each sender's messages still in order). The Work's
    ``source_rank()`` is the sender.

    CollectiveMismatchError if its shape or dtype differs (``array`` is then left as it
    was); DistTimeoutError if nothing comes before the timeout.
    """, "d.plan.prepare_recv(array, src, tag, group)",
         aio_doc="Start receiving into ``array`` (``src`` None: from any rank); awaiting the "
                 "handle\n    gives the sender's global rank."),
    Call("recv", f"array: np.ndarray, src: int | None = None, {_MESSAGE}", RECV, "int",
         "Blocking :func:`irecv`; returns the sender's global rank (as torch does).",
         "d.plan.prepare_recv(array, src, tag, group)",
         aio_doc="See :func:`minidist.recv`; returns the sender's global rank."),
    Call("recv_many", "output: np.ndarray, src: int | Sequence[int] | None = None, tag: int = 0, "
         "group: GroupArg = None, async_op: bool = False", MANY, "np.ndarray | {handle}",
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
    """, "d.plan_many(output, src, tag, group)",
         aio_doc="""See :func:`minidist.recv_many`; the senders (global ranks, int64), or with
    ``async_op`` a handle that gives them."""),
    Call("send_object", f"obj: Any, dst: int, {_MESSAGE}", FINISH, "None",
         "Send any picklable object to global rank ``dst`` (like mpi4py's ``send``).",
         "d.plan.prepare_send(objects.dumps(obj), dst, tag, group, is_object=True)"),
    Call("recv_object", f"src: int | None = None, {_MESSAGE}, return_source: bool = False",
         RECV_OBJECT, "Any",
         """Receive the next object sent by global rank ``src`` (None: by any rank) with
    ``tag``. With ``return_source``, return ``(obj, sender's global rank)``.""",
         "d.plan.prepare_recv(None, src, tag, group)"),
    Call("isend_object", f"obj: Any, dst: int, {_MESSAGE}", START, "{handle}",
         "Start sending a picklable object to global rank ``dst``.",
         "d.plan.prepare_send(objects.dumps(obj), dst, tag, group, is_object=True)",
         aio_doc="Start sending a picklable object; await the handle for completion."),
    Call("irecv_object", f"src: int | None = None, {_MESSAGE}", START_RECV_OBJECT,
         "{handle}",
         """Start receiving the next object from ``src`` (None: any rank); the Work's
    ``result()`` is the object and its ``source_rank()`` the sender.""",
         "d.plan.prepare_recv(None, src, tag, group)",
         aio_doc="""Start receiving the next object (``src`` None: from any rank); awaiting the
    handle gives ``(obj, sender's global rank)``."""),
    Call("iprobe", f"src: int | None = None, {_MESSAGE}", LOOP, "int | None",
         """The sender of the message a receive from ``src`` (None: any rank) with ``tag``
    would take now, without receiving it; None if none has arrived (never waits).""",
         "d.probe(src, tag, group, wait=False)"),
    Call("probe", f"src: int | None = None, {_MESSAGE}", LOOP, "int",
         "Like :func:`iprobe`, but wait (up to the timeout) until such a message arrives.",
         "d.probe(src, tag, group, wait=True)"),
    # ------------------------------------------------------------------ objects
    Call("broadcast_object", "obj: Any, src: int = 0, group: GroupArg = None", STEPS, "Any",
         "``obj`` of global rank ``src``, on every rank of the group (pickled).",
         "objects.broadcast_object(d, obj, src, group)"),
    Call("all_gather_object", "obj: Any, group: GroupArg = None", STEPS, "list[Any]",
         "Every rank's ``obj``, in group-rank order, on every rank (pickled).",
         "objects.all_gather_object(d, obj, group)"),
    Call("gather_object", "obj: Any, dst: int = 0, group: GroupArg = None", STEPS,
         "list[Any] | None",
         "Every rank's ``obj`` in group-rank order on global rank ``dst``; None elsewhere.",
         "objects.gather_object(d, obj, dst, group)"),
    Call("scatter_object", "objs: list[Any] | None, src: int = 0, group: GroupArg = None",
         STEPS, "Any",
         "Object ``i`` of ``objs`` (given on global rank ``src``) on group rank ``i``.",
         "objects.scatter_object(d, objs, src, group)"),
    # ------------------------------------------------------------------ failures
    Call("shrink_group", "ranks_to_exclude: list[int] | None = None, group: GroupArg = None",
         LOOP, "Group",
         """A new group of the members of ``group`` (the default group by default) that are
    left once ``ranks_to_exclude`` (global ranks; None: every member known to have died
    or left) are taken out.

    Only the members that stay call it. Every caller gets the same group: the same
    members in the same order (group ranks renumbered 0..n-1, as torch's
    ``shrink_group`` does; global ranks never change), the same new ``epoch`` and an id
    no earlier group had, so that nothing of the old group is mistaken for the new
    one's. A member that dies during the call is left out too (ULFM's
    ``MPIX_Comm_shrink``). Shrinking the default group makes the result the new default
    group for collectives (messages with ``group=None`` still address any rank).
    DistTimeoutError if a member that is neither excluded nor gone never calls it
    within the group's timeout; ValueError for ranks that are not members, named
    twice, or the caller itself.
    """, "d.shrink_group(ranks_to_exclude, group)"),
    Call("agree", "flag: bool, group: GroupArg = None", LOOP, "bool",
         """A fault-tolerant AND of ``flag`` over the live members of ``group`` (ULFM's
    ``MPIX_Comm_agree``): every member that calls it gets the same answer, also when
    another member dies during the call (its flag then does not count). Every live
    member must call it; DistTimeoutError if one does not within the group's timeout.""",
         "d.agree(flag, group)"),
    Call("wait_ranks", "ranks: list[int], timeout: float | None = None", LOOP, "list[int]",
         """The ranks of ``ranks`` that are alive (admitted and not gone), once all of them
    are or once ``timeout`` seconds (default: the job's timeout) have passed; ``0``
    just asks. A rank that died and was started again (``minidist run
    --restart-failed``, or any launcher's restart with the same rank) is alive again
    once the rendezvous admitted its new process; messages to and from it then work as
    before. Make the group that takes it back on one rank and send that group to the
    others (``new_group`` on each would differ if a member died and was started again
    in between: each takes the members' processes it knows of when it calls).""",
         "d.wait_ranks(ranks, timeout)"),
)}
"""Every user function of minidist and minidist.aio but the catalog's collectives
(:mod:`minidist.facade`), by name, in the order of the reference."""
