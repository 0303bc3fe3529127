"""minidist as a torch.distributed backend: ``init_process_group("minidist")``.

Registered when ``minidist.torch`` is imported. torch calls :func:`_create` once per
process group with a (prefixed) store, the group's rank and size and, through the
extended API, the global ranks of the group. The returned :class:`ProcessGroupMinidist`
is a Python subclass of ``torch.distributed.ProcessGroup``, which torch then uses as the
whole process group; its methods mirror c10d's and return :class:`~._work.Work`, a
subclass of torch's Work whose ``wait()`` raises the call's minidist error and whose
Future fails with it. torch names every group it creates (``_set_group_name``); the
names are kept on the process group, so torch can find it by name.

Bootstrap (how the process joins minidist's job):

* minidist already initialized in this process (``minidist.init()`` from torchrun's or
  ``minidist run``'s environment, or ``minidist.torch.init_process_group``): the torch
  group maps onto that session; its world must be torch's world.
* otherwise, for the default group, from torch's store: rank 0 starts minidist's
  rendezvous on a free port (or ``MINIDIST_PORT``) and publishes ``addr:port:secret``
  under one key of the store; the other ranks read it and join. That port is the only
  one minidist opens; torch's store is used for nothing else.

Every further group (``new_group(backend="minidist")``) is a minidist group of the same
session: a tag on existing connections, no socket, no port, no store traffic.
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket
import threading
from typing import Any

import torch
import torch.distributed as tdist
from torch.distributed.constants import default_pg_timeout as _default_pg_timeout

from .. import api as md
from .. import startup
from ..env import DEFAULT_TIMEOUT, LaunchConfig
from ..errors import DistError
from ..group import WORLD_ID, Group
from . import _collectives as C
from ._work import Work, seconds, together

BACKEND = "minidist"
STORE_KEY = "minidist/rendezvous"

_bootstraps = 0  # store bootstraps by this process: a fresh key for each re-init
_lock = threading.Lock()


# ---------------------------------------------------------------------- bootstrap


def _advertised_addr(store: Any) -> str:
    """The address the other ranks use to reach rank 0's rendezvous by TCP (ranks on
    rank 0's node use its Unix socket and never need it)."""
    for var in ("MINIDIST_ADDR", "MASTER_ADDR"):
        if os.environ.get(var):
            return os.environ[var]
    inner = store
    while isinstance(inner, tdist.PrefixStore):
        inner = inner.underlying_store
    host = getattr(inner, "host", None) if isinstance(inner, tdist.TCPStore) else None
    if host and host not in ("localhost", "127.0.0.1", "::1"):
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _single_node(world_size: int) -> bool:
    try:
        lws = int(os.environ.get("LOCAL_WORLD_SIZE", ""))
        ws = int(os.environ.get("WORLD_SIZE", ""))
    except ValueError:
        return False
    return lws == ws == world_size


def _own_port() -> int:
    """MINIDIST_PORT if set (and not the port of a minidist launcher), else 0: free."""
    if "MINIDIST_LAUNCHER" in os.environ:
        return 0
    return int(os.environ.get("MINIDIST_PORT") or 0)


def bootstrap_from_store(store: Any, rank: int, world_size: int, timeout: float) -> None:
    """Start minidist in this process from a torch store shared by the ``world_size``
    ranks (see the module docstring). On return, ``minidist.is_initialized()``."""
    global _bootstraps
    if world_size == 1:
        md.init(rank=0, world_size=1, timeout=timeout)
        return
    with _lock:
        key = f"{STORE_KEY}/{_bootstraps}"
        _bootstraps += 1
    serve = announce = None
    if rank == 0:
        secret = secrets.token_hex(16)
        host = "127.0.0.1" if _single_node(world_size) else "0.0.0.0"
        serve = (host, _own_port())
        addr, port = "127.0.0.1", 0  # this process hosts the rendezvous

        def announce(_host: str, bound: int) -> None:
            reach = "127.0.0.1" if host == "127.0.0.1" else _advertised_addr(store)
            store.set(key, f"{reach}\n{bound}\n{secret}")
    else:
        addr, port, secret = store.get(key).decode().split("\n")
    local_rank, local_size = rank, world_size
    if _single_node(world_size) or os.environ.get("WORLD_SIZE") == str(world_size):
        try:
            local_rank = int(os.environ.get("LOCAL_RANK", rank))
            local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        except ValueError:
            pass
    # as under torchrun: local rank 0 of every other node hosts its node's agent
    agent = local_rank == 0 and rank != 0 and local_size < world_size
    cfg = LaunchConfig(rank, world_size, local_rank, local_size, addr, int(port),
                       secret.encode(), False, "torch-store", host_agent=agent)
    md.attach(startup.start(cfg, timeout, host=serve, announce=announce))


# ---------------------------------------------------------------------- the process group


def _one(tensors: Any, what: str) -> torch.Tensor:
    if isinstance(tensors, torch.Tensor):
        return tensors
    if len(tensors) != 1:
        raise ValueError(f"minidist {what}: expects exactly one tensor per call, got "
                         f"{len(tensors)}")
    return tensors[0]


def _work(opts: Any, work: Work) -> Work:
    """The Work torch gets for a call: ``work`` itself (a torch Work whose ``wait()``
    raises the call's error), bounded by the call's own timeout when torch set one
    (``barrier(timeout=)``; unset is negative)."""
    t = getattr(opts, "timeout", None)
    if isinstance(t, datetime.timedelta) and t >= datetime.timedelta(0):
        work.limit = seconds(t)
    return work


_CPU = torch.device("cpu")


def _has_cuda() -> bool:
    """Whether this process can pass CUDA tensors (a CUDA build of torch with a GPU)."""
    return bool(torch.version.cuda) and torch.cuda.is_available()


class ProcessGroupMinidist(tdist.ProcessGroup):
    """A torch.distributed process group served by minidist (CPU tensors; CUDA tensors
    through minidist_native).

    ``group`` is the minidist group (None: the world) whose group ranks are this
    process group's ranks. ``owns_session``: torch's destroy_process_group also
    ends the minidist session (it was started for this group).
    """

    def __init__(self, rank: int, size: int, group: Group | None,
                 owns_session: bool = False) -> None:
        super().__init__(rank, size)
        self._md_group = group
        self._owns = owns_session
        self._ranks = C.members(group)
        self._name = ""
        self._desc = ""
        self._coalesced: list[Work] | None = None  # between _start/_end_coalescing

    # ------------------------------------------------------------------ identity

    @property
    def minidist_group(self) -> Group | None:
        """The minidist group behind this process group (None: the world)."""
        return self._md_group

    @property
    def global_ranks(self) -> list[int]:
        """The global ranks of this group's members, in group-rank order (a copy)."""
        return list(self._ranks)

    def successor(self, group: Group) -> ProcessGroupMinidist:
        """A process group of the same class for ``group`` (made from this one's
        members, this rank among them); it owns the session from now on if this one did
        (torch's shrink_group destroys this one next)."""
        me = self._ranks[self.rank()]
        new = type(self)(group.rank_of(me), group.size, group, owns_session=self._owns)
        self._owns = False
        return new

    def getBackendName(self) -> str:
        return BACKEND

    # torch finds the backend that serves a device through ``pg._device_types`` and
    # ``pg._get_backend(device)`` (object collectives, the coalescing manager,
    # DeviceMesh, FSDP, checkpointing). c10d keeps those in C++ for the backends it
    # registers; this process group is its own backend, for the CPU.

    @property
    def _device_types(self) -> list[torch.device]:
        """The devices this group serves: the CPU, and CUDA where this process has it
        (CUDA tensors go through minidist_native)."""
        return [_CPU, torch.device("cuda")] if _has_cuda() else [_CPU]

    def _get_backend(self, device: Any) -> ProcessGroupMinidist:
        """The backend for ``device``: this group itself, for the CPU and CUDA."""
        kind = torch.device(device).type
        if kind == "cpu" or (kind == "cuda" and _has_cuda()):
            return self
        raise RuntimeError(f"No backend type associated with device type {kind} "
                           "(the minidist backend serves CPU tensors, and CUDA tensors "
                           "where CUDA is available)")

    @property
    def supports_splitting(self) -> bool:
        return False

    @property
    def supports_coalescing(self) -> bool:
        return False

    @property
    def supports_shrinking(self) -> bool:
        return True

    def shrink(self, ranks_to_exclude: list[int], shrink_flags: int = 0,
               opts: Any = None) -> ProcessGroupMinidist:
        """What ``torch.distributed.shrink_group`` asks of the backend: a new one for
        the members left once the group ranks ``ranks_to_exclude`` are taken out (see
        :func:`minidist.shrink_group`: the same group on every caller, also when another
        member dies during the call)."""
        from ._shrink import shrink

        return shrink(self, ranks_to_exclude, shrink_flags, opts)

    @property
    def supports_time_estimate(self) -> bool:
        return False

    def supports_tensor_alloc(self, device: Any = None) -> bool:
        return False

    def _start_coalescing(self, device: Any = None) -> None:
        """torch's ``_coalescing_manager(group, device)``: the calls made until
        :meth:`_end_coalescing` are started as they come, and waited for together."""
        self._get_backend(device if device is not None else _CPU)
        if self._coalesced is not None:
            raise RuntimeError("minidist: _start_coalescing called twice without "
                               "_end_coalescing")
        self._coalesced = []

    def _end_coalescing(self, device: Any = None) -> Work:
        """One Work for every call made since :meth:`_start_coalescing`."""
        works, self._coalesced = self._coalesced or [], None
        return together(works, [w.outputs for w in works], "coalesced")

    def _issue(self, opts: Any, work: Work) -> Work:
        work = _work(opts, work)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    # torch names every process group it creates (``_set_group_name`` /
    # ``_set_group_desc``); c10d keeps those names on its backends, which a Python
    # process group does not have, so they are kept here. ``group_name`` is how
    # destroy_process_group and functional collectives find the group.

    def _set_group_name(self, name: str) -> None:
        self._name = str(name)

    def _set_group_desc(self, desc: str) -> None:
        self._desc = str(desc)

    def getGroupName(self) -> str:  # noqa: N802  (c10d's name)
        return self._name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    @property
    def timeout(self) -> datetime.timedelta | None:
        """What bounds every call on this group (None: the job's timeout)."""
        t = self._md_group.timeout if self._md_group is not None else None
        return None if t is None else datetime.timedelta(seconds=t)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """Bound every later call on this group by ``timeout`` (0: do not wait)."""
        t = seconds(timeout)
        if t is None:
            raise TypeError("set_timeout: expects a timedelta or seconds, not None")
        g = self._md_group
        if g is None:  # the world: same id, same ranks
            g = Group(WORLD_ID, self._ranks, "world")
        self._md_group = Group(g.id, g.ranks, g.name, timeout=t)

    def __repr__(self) -> str:
        name = f", name={self._name!r}" if self._name else ""
        return f"ProcessGroupMinidist(rank={self.rank()}, size={self.size()}{name})"

    def _global(self, group_rank: int) -> int:
        if not 0 <= group_rank < len(self._ranks):
            raise ValueError(f"rank {group_rank} is outside this group of "
                             f"{len(self._ranks)}")
        return self._ranks[group_rank]

    # ------------------------------------------------------------------ collectives

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else "SUM"
        return self._issue(opts, C.all_reduce(_one(tensors, "allreduce"), op, self._md_group))

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else "SUM"
        works = [C.all_reduce(t, op, self._md_group) for t in tensors]
        return self._issue(opts, together(works, list(tensors), "allreduce_coalesced"))

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        return self._issue(opts, C.broadcast(_one(tensors, "broadcast"), self._global(root),
                                             self._md_group))

    def reduce(self, tensors: Any, opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        op = opts.reduceOp if opts is not None else "SUM"
        return self._issue(opts, C.reduce(_one(tensors, "reduce"), self._global(root), op,
                                          self._md_group))

    def allgather(self, output_lists: Any, inputs: Any, opts: Any = None) -> Any:
        if len(output_lists) != 1:
            raise ValueError("minidist allgather: expects one output list")
        w = C.all_gather(output_lists[0], _one(inputs, "allgather"), self._md_group)
        w.outputs = output_lists
        return self._issue(opts, w)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: Any = None) -> Any:
        return self._issue(opts, C.all_gather_into_tensor(output, input, self._md_group))

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: Any, inputs: Any,
                                        opts: Any = None) -> Any:
        works = [C.all_gather_into_tensor(o, i, self._md_group)
                 for o, i in zip(outputs, inputs)]
        return self._issue(opts, together(works, list(outputs), "allgather_into_tensor_coalesced"))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather_coalesced(self, output_lists: Any, inputs: Any, opts: Any = None) -> Any:
        """torch's all_gather_coalesced: ``output_lists[j][i]`` receives group rank
        ``j``'s ``inputs[i]`` (one all_gather per input)."""
        n = len(self._ranks)
        if len(output_lists) != n:
            raise ValueError(f"minidist allgather_coalesced: expects one output list per "
                             f"rank of the group ({n}), got {len(output_lists)}")
        for j, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise ValueError(f"minidist allgather_coalesced: output list {j} has "
                                 f"{len(outs)} tensors for {len(inputs)} inputs")
        works = [C.all_gather([output_lists[j][i] for j in range(n)], t, self._md_group)
                 for i, t in enumerate(inputs)]
        return self._issue(opts, together(works, output_lists, "allgather_coalesced"))

    def reduce_scatter(self, outputs: Any, input_lists: Any, opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else "SUM"
        if len(input_lists) != 1:
            raise ValueError("minidist reduce_scatter: expects one input list")
        return self._issue(opts, C.reduce_scatter(_one(outputs, "reduce_scatter"),
                                                  input_lists[0], op, self._md_group))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else "SUM"
        return self._issue(opts, C.reduce_scatter_tensor(output, input, op, self._md_group))

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs: Any, inputs: Any,
                                        opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else "SUM"
        works = [C.reduce_scatter_tensor(o, i, op, self._md_group)
                 for o, i in zip(outputs, inputs)]
        return self._issue(opts, together(works, list(outputs), "reduce_scatter_tensor_coalesced"))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def gather(self, output_lists: Any, inputs: Any, opts: Any = None) -> Any:
        root = self._global(opts.rootRank if opts is not None else 0)
        outs = output_lists[0] if len(output_lists) else None
        w = C.gather(_one(inputs, "gather"), outs, root, self._md_group)
        w.outputs = output_lists
        return self._issue(opts, w)

    def scatter(self, outputs: Any, input_lists: Any, opts: Any = None) -> Any:
        root = self._global(opts.rootRank if opts is not None else 0)
        ins = input_lists[0] if len(input_lists) else None
        return self._issue(opts, C.scatter(_one(outputs, "scatter"), ins, root, self._md_group))

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: Any = None, input_split_sizes: Any = None,
                      opts: Any = None) -> Any:
        return self._issue(opts, C.all_to_all_single(output, input, output_split_sizes,
                                                     input_split_sizes, self._md_group))

    all_to_all_single = alltoall_base

    def alltoall(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._issue(opts, C.all_to_all(list(outputs), list(inputs), self._md_group))

    def barrier(self, opts: Any = None) -> Any:
        return self._issue(opts, C.barrier(self._md_group))

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        C.monitored_barrier(self._md_group, seconds(timeout), wait_all_ranks)

    # ------------------------------------------------------------------ point-to-point

    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> Any:  # noqa: N803
        return self._issue(None, C.isend(_one(tensors, "send"), self._global(dstRank), tag,
                                         self._md_group))

    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> Any:  # noqa: N803
        return self._issue(None, C.irecv(_one(tensors, "recv"), self._global(srcRank), tag,
                                         self._md_group))

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Any:
        """A receive from any rank of the group (``torch.distributed.recv(t)`` /
        ``irecv(t)`` without ``src``): the Work's ``_source_rank()`` is the sender's rank
        in this group, which torch turns into the global rank it returns."""
        return self._issue(None, C.irecv(_one(tensors, "recv"), None, tag, self._md_group))

    # ------------------------------------------------------------------ lifecycle

    def shutdown(self) -> None:
        if self._owns:
            self._owns = False
            md.destroy()

    def abort(self) -> None:
        self.shutdown()


def _launcher_world(rank: int, size: int) -> bool:
    """Whether this process runs under ``minidist run`` as global rank ``rank`` of
    ``size`` (then the launcher's rendezvous is joined; torch's store is not needed)."""
    env = os.environ
    return ("MINIDIST_LAUNCHER" in env and env.get("RANK") == str(rank)
            and env.get("WORLD_SIZE") == str(size))


def _given_timeout(opts: Any) -> float | None:
    """The timeout passed to init_process_group / new_group, in seconds; None when it
    was not given (torch then passes its default, which counts as not given)."""
    t = getattr(opts, "timeout", None)
    if not isinstance(t, datetime.timedelta) or t == _default_pg_timeout:
        return None
    return seconds(t)


def _world_timeout() -> float | None:
    """The timeout of torch's default group when it is served by this backend."""
    pg = tdist.GroupMember.WORLD if tdist.is_initialized() else None
    if isinstance(pg, ProcessGroupMinidist) and pg.minidist_group is not None:
        return pg.minidist_group.timeout
    return None


def _create(opts: Any, backend_options: Any = None) -> ProcessGroupMinidist:
    """torch's creator (extended API): a process group for ``opts.global_ranks_in_group``
    (empty: the default group).

    Timeouts: a timeout given to init_process_group bounds every call on the default
    group and on every group created without one; a timeout given to new_group bounds
    the calls on that group. 0 means "do not wait". Without one, MINIDIST_TIMEOUT (or
    300 s) applies, as for minidist's own calls.
    """
    rank, size = opts.group_rank, opts.group_size
    ranks = [int(r) for r in opts.global_ranks_in_group]
    given = _given_timeout(opts)
    owns = False
    if not md.is_initialized():
        if ranks and ranks != list(range(tdist.get_world_size())):
            raise DistError(
                "minidist backend: minidist is not initialized in this process, and a "
                "group of some ranks cannot start it (the other ranks never join). Make "
                "'minidist' the default backend (init_process_group('minidist')), or "
                "call minidist.init() on every rank first")
        # joining the job needs some time even when calls may not wait (timeout 0)
        env = os.environ.get("MINIDIST_TIMEOUT")
        timeout = given or (float(env) if env else DEFAULT_TIMEOUT)
        me = tdist.get_rank() if ranks else rank
        if _launcher_world(me, size):
            md.init(timeout=timeout)  # minidist run hosts the rendezvous: join it
        else:
            bootstrap_from_store(opts.store, me, size, timeout)
        owns = not ranks
    world = md.get_world_size()
    if not ranks:
        if size != world or rank != md.get_rank():
            raise DistError(
                f"minidist backend: torch's default group is rank {rank} of {size}, but "
                f"this process is rank {md.get_rank()} of {world} in minidist's job; "
                "they must be the same world")
        g = None
        if given is not None:
            # the world (same id: the same group), bounded by the given timeout
            g = Group(WORLD_ID, tuple(range(world)), "world", timeout=given)
        return ProcessGroupMinidist(rank, size, g, owns)
    if tdist.get_rank() != md.get_rank():
        raise DistError(f"minidist backend: this process is rank {tdist.get_rank()} for "
                        f"torch but rank {md.get_rank()} for minidist; they must agree")
    if max(ranks) >= world:
        raise DistError(f"minidist backend: group ranks {ranks} exceed minidist's world "
                        f"of {world}")
    g = md.new_group(ranks, timeout=given if given is not None else _world_timeout())
    if ranks != sorted(ranks):  # torch's sort_ranks=False: group ranks in given order
        g = Group(g.id, tuple(ranks), g.name, timeout=g.timeout)
    return ProcessGroupMinidist(rank, size, g)


def register() -> None:
    """Register the "minidist" backend with torch.distributed (idempotent)."""
    if BACKEND.upper() in getattr(tdist.Backend, "_plugins", {}):
        return
    devices = ["cpu", "cuda"] if torch.version.cuda else ["cpu"]
    tdist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=devices)


class SessionStore(tdist.Store):
    """A torch Store over minidist's own key/value store (the rendezvous'), so torch's
    default group can be created without another port."""

    def __init__(self, timeout: float | None = None) -> None:
        super().__init__()
        self._store = md.get_store()
        self._timeout = timeout

    def set(self, key: str, value: Any) -> None:
        self._store.set(key, value if isinstance(value, (bytes, str)) else bytes(value))

    def get(self, key: str) -> bytes:
        return self._store.get(key, self._timeout)

    def add(self, key: str, amount: int) -> int:
        return self._store.add(key, amount)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._store.compare_set(key, expected, desired)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        t = seconds(timeout) if timeout is not None else self._timeout
        self._store.wait(list(keys), t)

    def check(self, keys: list[str]) -> bool:
        return self._store.check(list(keys))

    def delete_key(self, key: str) -> bool:
        return self._store.delete_key(key)

    def num_keys(self) -> int:
        return self._store.num_keys()
