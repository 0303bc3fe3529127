"""The Ray collective group class of the "minidist" backend.

Ray's ``ray.util.collective`` creates one instance per (process, group name), with
``(world_size, rank, group_name)``, and calls its methods with every tensor wrapped in
a list (``allreduce([t], opts)``, ``allgather([[t0, t1, ...]], [t], opts)``) and an
options object (``ray.util.collective.types``; sometimes the class itself, whose
attributes Ray sets). Ranks in the options are ranks of the Ray group.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Any

import numpy as np
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import ReduceOp as RayReduceOp

from ..api import ReduceOp
from ..env import default_timeout
from ..errors import DistError
from ..group import Group
from . import _bootstrap

BACKEND = "minidist"

_OPS = {RayReduceOp.SUM: ReduceOp.SUM, RayReduceOp.PRODUCT: ReduceOp.PRODUCT,
        RayReduceOp.MIN: ReduceOp.MIN, RayReduceOp.MAX: ReduceOp.MAX}

_timeout: float | None = None


def set_timeout(seconds: float | None) -> None:
    """Bound every later group creation and call of this process by ``seconds`` (None:
    ``MINIDIST_TIMEOUT``, else 300 s). Ray passes no timeout to a backend's groups, so
    call this in the actor before ``init_collective_group``."""
    global _timeout
    if seconds is not None and (isinstance(seconds, bool) or not seconds > 0):
        raise ValueError(f"timeout must be a positive number of seconds, not {seconds!r}")
    _timeout = None if seconds is None else float(seconds)


def get_timeout() -> float:
    """The timeout new groups get (see :func:`set_timeout`)."""
    return _timeout if _timeout is not None else default_timeout(os.environ)


def _op(op: Any) -> ReduceOp:
    if isinstance(op, RayReduceOp):
        return _OPS[op]
    return ReduceOp(op) if not isinstance(op, str) else ReduceOp[op.upper()]


def _array(t: Any, what: str, reduced: bool = False) -> np.ndarray:
    """``t`` (a numpy array or a CPU torch tensor) as a numpy array on the same memory.

    A tensor whose dtype numpy lacks (bfloat16, float8) travels as integers of its
    width when nothing is reduced (broadcast, allgather, send, recv)."""
    if isinstance(t, np.ndarray):
        return t
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(t, torch.Tensor):
        raise TypeError(f"minidist {what}: expected a numpy array or a CPU torch tensor, "
                        f"not {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(f"minidist {what}: the tensor is on {t.device}; the Ray backend "
                        "'minidist' takes CPU tensors (use Ray's 'nccl' backend for GPUs)")
    if t.layout != torch.strided:
        raise TypeError(f"minidist {what}: a {t.layout} tensor; only dense tensors are "
                        "supported")
    t = t.detach()
    try:
        return t.numpy()
    except TypeError:
        ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        if reduced or t.element_size() not in ints:
            raise TypeError(f"minidist {what}: torch dtype {t.dtype} has no numpy "
                            "equivalent and cannot be reduced; convert it (e.g. to "
                            "float32) first") from None
        return t.view(ints[t.element_size()]).numpy()


def _one(tensors: Any, what: str) -> Any:
    """The single tensor of Ray's list (several are Ray's multi-GPU calls)."""
    if isinstance(tensors, (list, tuple)):
        if len(tensors) != 1:
            raise ValueError(f"minidist {what}: expects one tensor per process, got "
                             f"{len(tensors)} (multi-GPU calls are not supported)")
        return tensors[0]
    return tensors


class MinidistGroup(BaseGroup):
    """A Ray collective group served by minidist (numpy arrays, CPU torch tensors).

    Created by Ray in each actor: ``ray.util.collective.init_collective_group(
    world_size, rank, backend="minidist", group_name=...)``, or lazily after the driver's
    ``create_collective_group``. Blocks until every rank has called it (at most the
    timeout, see :func:`set_timeout`).
    """

    def __init__(self, world_size: int, rank: int, group_name: str) -> None:
        super().__init__(world_size, rank, group_name)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        self._job, self._group = _bootstrap.join(group_name, world_size, rank,
                                                 get_timeout())
        self._door = self._job.door

    @classmethod
    def backend(cls) -> str:
        return BACKEND.upper()

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True

    # ------------------------------------------------------------------ what it is

    @property
    def minidist_group(self) -> Group | None:
        """The minidist group behind this Ray group (None: the world of its own job)."""
        return self._group

    @property
    def job(self) -> str:
        """The public key of the minidist job that serves this group."""
        return self._door.job

    def __repr__(self) -> str:
        return (f"MinidistGroup({self.group_name!r}, rank {self.rank} of "
                f"{self.world_size}, job {self._door.job}, {self._group or 'world'})")

    def destroy_group(self) -> None:
        """Leave the group; the process leaves the job with its last group."""
        job, self._job = self._job, None
        if job is not None:
            _bootstrap.leave(job, self.group_name)

    # ------------------------------------------------------------------ helpers

    def _on(self, opts: Any, what: str) -> Group | None:
        """The group a call runs on, bounded by the options' timeout when one is set."""
        if self._job is None:
            raise DistError(f"minidist {what}: Ray collective group {self.group_name!r} "
                            "was destroyed")
        t = getattr(opts, "timeout_ms", None)
        if isinstance(t, datetime.timedelta) and t >= datetime.timedelta(0):
            g = self._group or self._door.world
            return Group(g.id, g.ranks, g.name, timeout=t.total_seconds())
        return self._group

    def _global(self, rank: int, what: str) -> int:
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"minidist {what}: rank {rank!r} is outside "
                             f"0..{self.world_size - 1}")
        return rank if self._group is None else self._group.global_rank(rank)

    def _run(self, item: Any) -> None:
        try:
            self._door.wait(item)
        except DistError as e:  # name the Ray group (and its ranks) in the message
            where = f"Ray collective group {self.group_name!r} (backend minidist)"
            if self._group is not None:
                where += (f"; ranks named above are the minidist job's: Ray ranks "
                          f"0..{self.world_size - 1} are its ranks {self._group.ranks}")
            e.args = (f"{e.args[0] if e.args else e} [{where}]", *e.args[1:])
            raise

    # ------------------------------------------------------------------ collectives

    def allreduce(self, tensor: Any, allreduce_options: Any = None) -> None:
        g = self._on(allreduce_options, "allreduce")
        a = _array(_one(tensor, "allreduce"), "allreduce", reduced=True)
        op = _op(getattr(allreduce_options, "reduceOp", RayReduceOp.SUM))
        self._run(self._door.plan.prepare_all_reduce(a, op, g, None))

    def barrier(self, barrier_options: Any = None) -> None:
        g = self._on(barrier_options, "barrier")
        self._run(self._door.plan.prepare_barrier(g))

    def reduce(self, tensor: Any, reduce_options: Any = None) -> None:
        g = self._on(reduce_options, "reduce")
        a = _array(_one(tensor, "reduce"), "reduce", reduced=True)
        dst = self._global(getattr(reduce_options, "root_rank", 0), "reduce")
        op = _op(getattr(reduce_options, "reduceOp", RayReduceOp.SUM))
        self._run(self._door.plan.prepare_reduce(a, dst, op, g, None))

    def broadcast(self, tensor: Any, broadcast_options: Any = None) -> None:
        g = self._on(broadcast_options, "broadcast")
        a = _array(_one(tensor, "broadcast"), "broadcast")
        src = self._global(getattr(broadcast_options, "root_rank", 0), "broadcast")
        self._run(self._door.plan.prepare_broadcast(a, src, g, None))

    def allgather(self, tensor_list: Any, tensor: Any, allgather_options: Any = None) -> None:
        """``tensor_list[0][i]`` receives rank ``i``'s ``tensor[0]``."""
        g = self._on(allgather_options, "allgather")
        inp = _array(_one(tensor, "allgather"), "allgather")
        outs = [_array(t, "allgather") for t in _one(tensor_list, "allgather")]
        self._check_list(outs, inp, "allgather", "output")
        for i, out in enumerate(outs):
            if not out.flags.writeable:
                raise ValueError(f"minidist allgather: output {i} is read-only")
        buf = np.empty((self.world_size, *inp.shape), inp.dtype)
        self._run(self._door.plan.prepare_all_gather(buf, inp, g, None))
        for out, block in zip(outs, buf):
            np.copyto(out, block)

    def reducescatter(self, tensor: Any, tensor_list: Any,
                      reducescatter_options: Any = None) -> None:
        """Rank ``i``'s ``tensor[0]`` receives the reduction of every rank's
        ``tensor_list[0][i]`` (the inputs are left as they were)."""
        g = self._on(reducescatter_options, "reducescatter")
        out = _array(_one(tensor, "reducescatter"), "reducescatter", reduced=True)
        ins = [_array(t, "reducescatter", reduced=True)
               for t in _one(tensor_list, "reducescatter")]
        self._check_list(ins, out, "reducescatter", "input")
        op = _op(getattr(reducescatter_options, "reduceOp", RayReduceOp.SUM))
        inp = np.concatenate([a.reshape(-1) for a in ins]) if out.size else out.reshape(0)
        self._run(self._door.plan.prepare_reduce_scatter(out, inp, op, g, None))

    def _check_list(self, arrays: list[np.ndarray], like: np.ndarray, what: str,
                    kind: str) -> None:
        if len(arrays) != self.world_size:
            raise ValueError(f"minidist {what}: {len(arrays)} {kind} tensors for a group "
                             f"of {self.world_size}")
        for i, a in enumerate(arrays):
            if a.shape != like.shape or a.dtype != like.dtype:
                raise ValueError(f"minidist {what}: {kind} {i} is {a.dtype}{list(a.shape)}, "
                                 f"expected {like.dtype}{list(like.shape)}")

    # ------------------------------------------------------------------ point-to-point

    def send(self, tensor: Any, send_options: Any) -> None:
        g = self._on(send_options, "send")
        a = _array(_one(tensor, "send"), "send")
        dst = self._global(getattr(send_options, "dst_rank", 0), "send")
        self._run(self._door.plan.prepare_send(a, dst, 0, g))

    def recv(self, tensor: Any, recv_options: Any) -> None:
        g = self._on(recv_options, "recv")
        a = _array(_one(tensor, "recv"), "recv")
        src = self._global(getattr(recv_options, "src_rank", 0), "recv")
        self._run(self._door.plan.prepare_recv(a, src, 0, g))
