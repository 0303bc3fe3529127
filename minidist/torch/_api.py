"""The drop-in module: torch.distributed's functions, names, signatures and defaults,
served by minidist. ``import minidist.torch as dist`` in place of
``import torch.distributed as dist``.

Groups are minidist groups (``new_group`` returns a :class:`minidist.Group`, or
``GroupMember.NON_GROUP_MEMBER`` on a rank outside it); process groups of the
registered "minidist" torch backend are accepted wherever a group is.
"""

from __future__ import annotations

import datetime
import os
import urllib.parse
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .. import api as md
from .. import facade
from ..env import DEFAULT_TIMEOUT
from ..errors import DistTimeoutError
from ..group import NON_GROUP_MEMBER, WORLD_ID, Group, GroupMember
from . import _backend
from . import _collectives as C
from ._tensors import forget_views
from ._work import Work, seconds

_NOT_MEMBER = NON_GROUP_MEMBER
_TORCH_NON_MEMBER = -100  # torch.distributed.GroupMember.NON_GROUP_MEMBER

_state: dict[str, Any] = {"owns": False, "mirrored": False,
                          "world": None}  # the world with init_process_group's timeout


# ---------------------------------------------------------------------- helpers


def _check_backend(backend: Any) -> None:
    name = str(backend or "").lower()
    if "nccl" in name or "cuda" in name or "xccl" in name:
        raise NotImplementedError(
            f"minidist.torch: backend {backend!r} needs GPUs, which minidist.torch does "
            "not serve yet; use a CPU backend name ('gloo' or 'minidist') and CPU tensors")


def _group(group: Any) -> Group | None | object:
    """The minidist group for a group argument: None (or, after a timeout was given to
    init_process_group, the world with that timeout) for the world, _NOT_MEMBER when
    this rank is not in it."""
    if group is None:
        return _state["world"]
    if group is NON_GROUP_MEMBER or (isinstance(group, int) and not isinstance(group, bool)
                                     and group == _TORCH_NON_MEMBER):
        return _NOT_MEMBER
    if isinstance(group, Group):
        return group if md.get_rank() in group else _NOT_MEMBER
    if isinstance(group, _backend.ProcessGroupMinidist):
        return group.minidist_group
    if isinstance(group, torch.distributed.ProcessGroup):
        raise TypeError(f"minidist.torch: {group!r} is a process group of another "
                        "torch.distributed backend; pass a minidist group (new_group) or a "
                        "process group of the 'minidist' backend")
    raise TypeError(f"group must be a group from new_group(), or None, not {group!r}")


def _skip(g: Any, what: str) -> bool:
    """True (after torch's warning) when this rank is not in the group."""
    if g is _NOT_MEMBER:
        warnings.warn(f"Running {what} on global rank {md.get_rank()} which does not belong "
                      "to the given group.", stacklevel=3)
        return True
    return False


def _root(g: Group | None, rank: int | None, group_rank: int | None, name: str,
          default0: bool = False) -> int:
    """A global rank from either a global rank or a group rank (exactly one)."""
    if group_rank is not None:
        if rank is not None:
            raise ValueError(f"Can't specify both {name} and group_{name}")
        ranks = C.members(g)
        if not 0 <= group_rank < len(ranks):
            raise ValueError(f"group_{name}={group_rank} is outside the group of "
                             f"{len(ranks)} ranks")
        return ranks[group_rank]
    if rank is None:
        if default0:
            return 0
        raise ValueError(f"Must specify {name} or group_{name}")
    return int(rank)


def _done(w: Work, async_op: bool) -> Work | None:
    if async_op:
        return w
    w.wait()
    return None


# ---------------------------------------------------------------------- lifecycle


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return md.is_initialized()


def is_gloo_available() -> bool:
    """True: CPU backend names such as "gloo" are served by minidist."""
    return True


def is_nccl_available() -> bool:
    return False


def is_mpi_available() -> bool:
    return False


def is_torchelastic_launched() -> bool:
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: datetime.timedelta | None = None, world_size: int = -1,
                       rank: int = -1, store: Any = None, group_name: str = "",
                       pg_options: Any = None, device_id: Any = None,
                       _ranks: list[int] | None = None) -> None:
    """Join the job, like torch.distributed.init_process_group, served by minidist.

    Any CPU backend name (``"gloo"``, ``"minidist"``, None) is accepted; GPU backends
    raise NotImplementedError. ``init_method``: ``"env://"`` (default: torchrun's,
    ``minidist run``'s, Slurm's or Open MPI's environment; under torchrun minidist
    listens on MINIDIST_PORT or MASTER_PORT + 1), ``"tcp://host:port"`` (minidist's
    rendezvous on that port, hosted by rank 0) or ``"file://path"`` (a torch FileStore
    that only carries minidist's address). ``store``: bootstrap from that torch store.
    Afterwards torch.distributed's own default group is also set up on minidist (the
    "minidist" backend; no port or socket), so DistributedDataParallel and other torch
    utilities work unchanged; MINIDIST_TORCH_MIRROR=0 turns that off.
    """
    _check_backend(backend)
    if device_id is not None and torch.device(device_id).type != "cpu":
        _check_backend("cuda")
    if md.is_initialized():
        if _state["owns"]:
            raise ValueError("trying to initialize the default process group twice!")
        # minidist.init() ran first: adopt its session (it must be the same world)
        if (rank >= 0 and rank != md.get_rank()) or (
                world_size > 0 and world_size != md.get_world_size()):
            raise ValueError(f"init_process_group(rank={rank}, world_size={world_size}): "
                             f"minidist is already initialized as rank {md.get_rank()} of "
                             f"{md.get_world_size()}")
        _set_world(seconds(timeout))
        _mirror()
        return
    if store is not None and init_method is not None:
        raise ValueError("Cannot specify both init_method and store.")
    given = seconds(timeout)
    t = given or None  # joining the job needs time even when calls may not wait (0)
    if t is None and os.environ.get("MINIDIST_TIMEOUT"):
        t = float(os.environ["MINIDIST_TIMEOUT"])
    r = rank if rank is not None and rank >= 0 else None
    ws = world_size if world_size is not None and world_size > 0 else None
    if store is not None:
        if r is None or ws is None:
            raise ValueError("init_process_group(store=...) needs rank and world_size")
        _backend.bootstrap_from_store(store, r, ws, t or DEFAULT_TIMEOUT)
    elif init_method is None or init_method.startswith("env://"):
        _init_env(r, ws, t)
    elif init_method.startswith("tcp://"):
        url = urllib.parse.urlparse(init_method)
        q = urllib.parse.parse_qs(url.query)
        r = r if r is not None else int(q["rank"][0]) if "rank" in q else None
        ws = ws if ws is not None else int(q["world_size"][0]) if "world_size" in q else None
        if r is None or ws is None:
            raise ValueError("init_method tcp:// needs rank and world_size")
        md.init(rank=r, world_size=ws, master_addr=url.hostname or "127.0.0.1",
                master_port=url.port, timeout=t)
    elif init_method.startswith("file://"):
        if r is None or ws is None:
            raise ValueError("init_method file:// needs rank and world_size")
        fs = torch.distributed.FileStore(urllib.parse.urlparse(init_method).path, ws)
        _backend.bootstrap_from_store(fs, r, ws, t or DEFAULT_TIMEOUT)
    else:
        raise ValueError(f"unsupported init_method {init_method!r} (env://, tcp://, "
                         "file:// or a store)")
    _state["owns"] = True
    _set_world(given)
    _mirror()


def _set_world(timeout: float | None) -> None:
    """Calls on the world are bounded by ``timeout`` (None: the job's timeout)."""
    _state["world"] = None if timeout is None else Group(
        WORLD_ID, tuple(range(md.get_world_size())), "world", timeout=timeout)


def _default_timeout() -> float | None:
    """What bounds a new group's calls when new_group is given no timeout."""
    return _state["world"].timeout if _state["world"] is not None else None


def _init_env(r: int | None, ws: int | None, t: float | None) -> None:
    env = os.environ
    if r is None and ws is None:
        md.init(timeout=t)
        return
    r = r if r is not None else int(env["RANK"]) if "RANK" in env else None
    ws = ws if ws is not None else int(env["WORLD_SIZE"]) if "WORLD_SIZE" in env else None
    if r is None or ws is None:
        raise ValueError("init_process_group: rank and world_size must both be known "
                         "(arguments or RANK / WORLD_SIZE)")
    if "MINIDIST_LAUNCHER" in env or "RANK" in env:
        md.init(rank=r, world_size=ws, timeout=t)
        return
    # processes started by hand (mp.spawn and MASTER_ADDR/MASTER_PORT): the port torch
    # would have bound on rank 0 is minidist's
    port = env.get("MINIDIST_PORT") or env.get("MASTER_PORT")
    md.init(rank=r, world_size=ws, master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(port) if port else None, timeout=t)


def _mirror() -> None:
    """torch.distributed's default group on the same minidist session."""
    if os.environ.get("MINIDIST_TORCH_MIRROR", "1") == "0":
        return
    td = torch.distributed
    if td.is_initialized():
        return
    job_timeout = md.door().timeout
    t = _default_timeout()
    td.init_process_group(_backend.BACKEND, store=_backend.SessionStore(job_timeout),
                          rank=md.get_rank(), world_size=md.get_world_size(),
                          timeout=datetime.timedelta(seconds=job_timeout if t is None else t))
    _state["mirrored"] = True


def destroy_process_group(group: Any = None) -> None:
    """Leave the job (group None) and release every socket; init_process_group may be
    called again. A group other than the world holds nothing to release."""
    if group is not None:
        if isinstance(group, torch.distributed.ProcessGroup):
            torch.distributed.destroy_process_group(group)
        return
    _state["mirrored"] = _state["owns"] = False
    _state["world"] = None
    forget_views()
    td = torch.distributed
    if td.is_initialized() and isinstance(td.GroupMember.WORLD, _backend.ProcessGroupMinidist):
        td.destroy_process_group()  # torch's default group on this session goes with it
    md.destroy()


class group:  # noqa: N801  (torch.distributed.group)
    """``group.WORLD``: the default group (None), as in torch.distributed."""

    WORLD = None


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (the world by default); -1 if not a member."""
    g = _group(group)
    return -1 if g is _NOT_MEMBER else md.get_rank(g)


def get_world_size(group: Any = None) -> int:
    """The number of ranks in ``group``; -1 on a rank outside it."""
    g = _group(group)
    return -1 if g is _NOT_MEMBER else md.get_world_size(g)


def get_backend(group: Any = None) -> str:
    """"minidist" (what serves every group of this module)."""
    if group is not None and _group(group) is _NOT_MEMBER:
        raise ValueError("Invalid process group specified")
    return torch.distributed.Backend(_backend.BACKEND)


def new_group(ranks: Sequence[int] | None = None, timeout: Any = None, backend: Any = None,
              pg_options: Any = None, use_local_synchronization: bool = False,
              group_desc: str | None = None, device_id: Any = None,
              sort_ranks: bool = True) -> Group | object:
    """A group of the given global ranks; opens no socket and needs no store traffic.

    Members call it in the same order as each other. Unlike torch.distributed, ranks
    outside the group need not call it. Returns ``GroupMember.NON_GROUP_MEMBER`` on a
    rank that is not a member. ``timeout`` (a timedelta or seconds) bounds every call
    on the group (0: calls do not wait); without it, init_process_group's timeout (or
    the job's) applies. ``pg_options`` is accepted and ignored.
    """
    _check_backend(backend)
    t = seconds(timeout)
    given = None if ranks is None else [int(r) for r in ranks]
    g = md.new_group(given, timeout=_default_timeout() if t is None else t)
    if (isinstance(g, Group) and given is not None and not sort_ranks
            and given != sorted(given)):
        g = Group(g.id, tuple(given), g.name, timeout=g.timeout)
    return g


def new_subgroups(group_size: int | None = None, group: Any = None, timeout: Any = None,
                  backend: Any = None, pg_options: Any = None,
                  group_desc: str | None = None) -> tuple[Any, list[Any]]:
    """Consecutive groups of ``group_size`` ranks (default: the processes per node):
    (this rank's subgroup, every subgroup)."""
    _check_backend(backend)
    g = _group(group)
    if g is _NOT_MEMBER:
        raise ValueError("new_subgroups: this rank is not in the parent group")
    t = seconds(timeout)
    return md.new_subgroups(group_size, g, timeout=_default_timeout() if t is None else t)


def get_process_group_ranks(group: Any) -> list[int]:
    g = _group(group)
    if g is _NOT_MEMBER:
        raise ValueError("this rank is not a member of the group")
    return list(C.members(g))


def get_group_rank(group: Any, global_rank: int) -> int:
    ranks = get_process_group_ranks(group)
    if global_rank not in ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {group}")
    return ranks.index(global_rank)


def get_global_rank(group: Any, group_rank: int) -> int:
    ranks = get_process_group_ranks(group)
    if not 0 <= group_rank < len(ranks):
        raise ValueError(f"Group rank {group_rank} is not part of group {group}")
    return ranks[group_rank]


# ---------------------------------------------------------------------- collectives


def all_reduce(tensor: torch.Tensor, op: Any = md.ReduceOp.SUM, group: Any = None,
               async_op: bool = False) -> Work | None:
    """Reduce ``tensor`` across the group in place (bfloat16: in float32, rounded once)."""
    g = _group(group)
    if _skip(g, "all_reduce"):
        return None
    return _done(C.all_reduce(tensor, op, g, not async_op), async_op)


def broadcast(tensor: torch.Tensor, src: int | None = None, group: Any = None,
              async_op: bool = False, group_src: int | None = None) -> Work | None:
    g = _group(group)
    if _skip(g, "broadcast"):
        return None
    return _done(C.broadcast(tensor, _root(g, src, group_src, "src"), g,
                             blocking=not async_op), async_op)


def reduce(tensor: torch.Tensor, dst: int | None = None, op: Any = md.ReduceOp.SUM,
           group: Any = None, async_op: bool = False,
           group_dst: int | None = None) -> Work | None:
    g = _group(group)
    if _skip(g, "reduce"):
        return None
    return _done(C.reduce(tensor, _root(g, dst, group_dst, "dst"), op, g,
                          blocking=not async_op), async_op)


def _generated(name: str, tensor: torch.Tensor, op: Any, group: Any, async_op: bool,
               algorithm: None) -> Work | None:
    g = _group(group)
    if _skip(g, name):
        return None
    return _done(C.collective(name, tensor, op, g, not async_op), async_op)


GENERATED: dict[str, Any] = {
    rec.front.function: facade.define(rec, _generated, "minidist.torch", first="tensor",
                                      annotation="torch.Tensor", algorithm=False)
    for rec in facade.records()}
"""The collectives with generated front ends, on tensors (minidist.torch.scan, ...)."""
globals().update(GENERATED)


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None,
            timeout: datetime.timedelta | None = None) -> Work | None:
    """Return once every rank of the group has entered. ``timeout`` bounds this wait
    (DistTimeoutError; 0: do not wait; the group should then be considered broken)."""
    g = _group(group)
    if _skip(g, "barrier"):
        return None
    limit = seconds(timeout)
    w = C.barrier(g, blocking=not async_op and limit is None)
    if limit is not None:
        w.limit = limit
    if async_op:
        return w
    w.wait()
    return None


def monitored_barrier(group: Any = None, timeout: datetime.timedelta | None = None,
                      wait_all_ranks: bool = False) -> None:
    """A barrier in which the group's first rank names the ranks that did not arrive
    within ``timeout`` (all of them with ``wait_all_ranks``), like gloo's."""
    g = _group(group)
    if _skip(g, "monitored_barrier"):
        return None
    C.monitored_barrier(g, seconds(timeout), wait_all_ranks)
    return None


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
               async_op: bool = False) -> Work | None:
    g = _group(group)
    if _skip(g, "all_gather"):
        return None
    return _done(C.all_gather(tensor_list, tensor, g), async_op)


def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                           group: Any = None, async_op: bool = False) -> Work | None:
    g = _group(group)
    if _skip(g, "all_gather_into_tensor"):
        return None
    return _done(C.all_gather_into_tensor(output_tensor, input_tensor, g), async_op)


def all_gather_single(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                      group: Any = None, async_op: bool = False) -> Work | None:
    """torch 2.13's name for :func:`all_gather_into_tensor`."""
    return all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor],
                   op: Any = md.ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> Work | None:
    g = _group(group)
    if _skip(g, "reduce_scatter"):
        return None
    return _done(C.reduce_scatter(output, input_list, op, g), async_op)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor,
                          op: Any = md.ReduceOp.SUM, group: Any = None,
                          async_op: bool = False) -> Work | None:
    g = _group(group)
    if _skip(g, "reduce_scatter_tensor"):
        return None
    return _done(C.reduce_scatter_tensor(output, input, op, g), async_op)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor,
                          op: Any = md.ReduceOp.SUM, group: Any = None,
                          async_op: bool = False) -> Work | None:
    """torch 2.13's name for :func:`reduce_scatter_tensor`."""
    return reduce_scatter_tensor(output, input, op, group, async_op)


def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None,
           dst: int | None = None, group: Any = None, async_op: bool = False,
           group_dst: int | None = None) -> Work | None:
    if not async_op and group_dst is None and C.again_sent(
            "gather", tensor, gather_list, 0 if dst is None else dst,
            _state["world"] if group is None else group):
        return None
    g = _group(group)
    if _skip(g, "gather"):
        return None
    dst = _root(g, dst, group_dst, "dst", default0=True)
    if md.get_rank() != dst:
        if gather_list:
            raise ValueError("Argument ``gather_list`` must NOT be specified on "
                             "non-destination ranks.")
        gather_list = None
    return _done(C.gather(tensor, gather_list, dst, g, not async_op), async_op)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None,
            src: int | None = None, group: Any = None, async_op: bool = False,
            group_src: int | None = None) -> Work | None:
    if not async_op and group_src is None and C.again_sent(
            "scatter", tensor, scatter_list, 0 if src is None else src,
            _state["world"] if group is None else group):
        return None
    g = _group(group)
    if _skip(g, "scatter"):
        return None
    src = _root(g, src, group_src, "src", default0=True)
    if md.get_rank() != src:
        if scatter_list:
            raise ValueError("Argument ``scatter_list`` must NOT be specified on "
                             "non-source ranks.")
        scatter_list = None
    return _done(C.scatter(tensor, scatter_list, src, g, not async_op), async_op)


def all_to_all(output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor],
               group: Any = None, async_op: bool = False) -> Work | None:
    g = _group(group)
    if _skip(g, "all_to_all"):
        return None
    return _done(C.all_to_all(output_tensor_list, input_tensor_list, g), async_op)


def all_to_all_single(output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, group: Any = None,
                      async_op: bool = False) -> Work | None:
    """Split ``input`` along dim 0 (evenly, or by ``input_split_sizes``) and send split
    ``j`` to group rank ``j``; split ``i`` of ``output`` comes from group rank ``i``.
    Uneven splits go as one message per peer."""
    g = _group(group)
    if _skip(g, "all_to_all_single"):
        return None
    return _done(C.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                     g), async_op)


# ---------------------------------------------------------------------- point-to-point


def isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> Work | None:
    """Send ``tensor`` to global rank ``dst``; do not modify it before the Work is done."""
    g = _group(group)
    if _skip(g, "isend"):
        return None
    return C.isend(tensor, _root(g, dst, group_dst, "dst"), tag, g)


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> Work | None:
    """Receive into ``tensor`` the next message from global rank ``src`` with ``tag``.
    ``src=None`` (and no ``group_src``): the first such message from any rank of the
    group; the Work's ``source_rank()`` is then the sender's global rank, and its
    ``_source_rank()`` (torch's) the sender's rank in the group."""
    g = _group(group)
    if _skip(g, "irecv"):
        return None
    if src is None and group_src is None:
        return C.irecv(tensor, None, tag, g)
    return C.irecv(tensor, _root(g, src, group_src, "src"), tag, g)


def send(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    if dst is not None and group_dst is None:
        g = _group(group)
        if g is not _NOT_MEMBER and C.send_again(tensor, dst, tag, g):
            return
    w = isend(tensor, dst, group, tag, group_dst)
    if w is not None:
        w.wait()


def recv_many(tensor: torch.Tensor, src: int | Sequence[int] | None = None, group: Any = None,
              tag: int = 0, async_op: bool = False) -> torch.Tensor | md.Work | None:
    """The first ``tensor.shape[0]`` messages to arrive into the rows of ``tensor`` (see
    :func:`minidist.recv_many`); returns their senders (global ranks) as an int64
    tensor, or with ``async_op`` a Work whose ``result()`` they are."""
    g = _group(group)
    if _skip(g, "recv_many"):
        return None
    return C.recv_many(tensor, src, tag, g, not async_op)


def recv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Blocking :func:`irecv`; returns the global rank of the sender (-1 outside the
    group), also for a receive from any source (``src=None``)."""
    if src is not None or group_src is not None:
        g = _group(group)
        if _skip(g, "recv"):
            return -1
        return C.recv(tensor, _root(g, src, group_src, "src"), tag, g)
    w = irecv(tensor, src, group, tag, group_src)
    if w is None:
        return -1
    w.wait()
    return w.source_rank()


class P2POp:
    """A point-to-point operation for :func:`batch_isend_irecv`: ``op`` is ``isend`` or
    ``irecv`` (this module's or torch.distributed's)."""

    def __init__(self, op: Any, tensor: torch.Tensor, peer: int | None = None,
                 group: Any = None, tag: int = 0, group_peer: int | None = None) -> None:
        name = getattr(op, "__name__", "")
        if name not in ("isend", "irecv"):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``isend`` or "
                             "``irecv``.")
        self.op = isend if name == "isend" else irecv
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag
        self.group_peer = group_peer

    def __repr__(self) -> str:
        return (f"P2POp({self.op.__name__}, peer={self.peer}, "
                f"group_peer={self.group_peer}, tag={self.tag})")


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Start every send and receive of the list; returns their Works (in order)."""
    if not isinstance(p2p_op_list, list) or not p2p_op_list or not all(
            isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type "
                         "``torch.distributed.P2POp``.")
    works = []
    for p in p2p_op_list:
        if p.op is isend:
            w = isend(p.tensor, p.peer, p.group, p.tag, p.group_peer)
        else:
            w = irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer)
        if w is not None:
            works.append(w)
    return works


# ---------------------------------------------------------------------- objects


def _fill(target: list[Any], values: list[Any], what: str) -> None:
    if len(target) < len(values):
        raise ValueError(f"{what}: the list has {len(target)} slots for {len(values)} "
                         "objects")
    for i, v in enumerate(values):
        target[i] = v


def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                          device: Any = None, group_src: int | None = None) -> None:
    """The objects of ``src``'s list, in place, on every rank (pickled)."""
    g = _group(group)
    if _skip(g, "broadcast_object_list"):
        return
    src = _root(g, src, group_src, "src", default0=True)
    values = md.broadcast_object(list(object_list), src, g)
    if md.get_rank() != src:
        if len(values) != len(object_list):
            raise ValueError(f"broadcast_object_list: rank {src} sent {len(values)} "
                             f"objects; this rank's list has {len(object_list)} slots")
        _fill(object_list, values, "broadcast_object_list")


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Every rank's ``obj`` into ``object_list`` (one slot per rank of the group)."""
    g = _group(group)
    if _skip(g, "all_gather_object"):
        return
    _fill(object_list, md.all_gather_object(obj, g), "all_gather_object")


def gather_object(obj: Any, object_gather_list: list[Any] | None = None,
                  dst: int | None = None, group: Any = None,
                  group_dst: int | None = None) -> None:
    g = _group(group)
    if _skip(g, "gather_object"):
        return
    dst = _root(g, dst, group_dst, "dst", default0=True)
    mine = md.get_rank() == dst
    if mine and object_gather_list is None:
        raise ValueError("gather_object: the destination rank must pass object_gather_list")
    if not mine and object_gather_list is not None:
        raise ValueError("Argument ``object_gather_list`` must NOT be specified on "
                         "non-destination ranks.")
    values = md.gather_object(obj, dst, g)
    if mine:
        _fill(object_gather_list, values, "gather_object")


def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None,
                        src: int | None = None, group: Any = None,
                        group_src: int | None = None) -> None:
    g = _group(group)
    if _skip(g, "scatter_object_list"):
        return
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError("Expected argument scatter_object_output_list to be a list of "
                         "size at least 1.")
    src = _root(g, src, group_src, "src", default0=True)
    objs = list(scatter_object_input_list) if md.get_rank() == src else None
    scatter_object_output_list[0] = md.scatter_object(objs, src, g)


def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None,
                     device: Any = None, group_dst: int | None = None,
                     use_batch: bool = False) -> None:
    g = _group(group)
    if _skip(g, "send_object_list"):
        return
    C.send_object(list(object_list), _root(g, dst, group_dst, "dst"), g)


def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                     device: Any = None, group_src: int | None = None,
                     use_batch: bool = False) -> int:
    """Fill ``object_list`` with the objects sent by ``send_object_list`` from ``src``
    (``src=None`` and no ``group_src``: from any rank of the group); returns the
    sender's global rank."""
    g = _group(group)
    if _skip(g, "recv_object_list"):
        return -1
    if src is not None or group_src is not None:
        src = _root(g, src, group_src, "src")
    values, src = C.recv_object(src, g)
    if len(values) != len(object_list):
        raise ValueError(f"recv_object_list: rank {src} sent {len(values)} objects; this "
                         f"rank's list has {len(object_list)} slots")
    _fill(object_list, values, "recv_object_list")
    return src


__all__ = [
    "is_available", "is_initialized", "is_gloo_available", "is_nccl_available",
    "is_mpi_available", "is_torchelastic_launched", "init_process_group",
    "destroy_process_group", "get_rank", "get_world_size", "get_backend", "new_group",
    "new_subgroups", "get_process_group_ranks", "get_group_rank", "get_global_rank",
    "all_reduce", "broadcast", "reduce", "barrier", "monitored_barrier", "all_gather",
    "all_gather_into_tensor", "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_single", "gather", "scatter", "all_to_all", "all_to_all_single", "isend",
    "irecv", "send", "recv", "P2POp",
    "batch_isend_irecv", "broadcast_object_list", "all_gather_object", "gather_object",
    "scatter_object_list", "send_object_list", "recv_object_list", "GroupMember",
    "DistTimeoutError", "group",
]
