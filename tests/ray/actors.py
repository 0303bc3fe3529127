"""The actor the Ray tests use (imported by the Ray workers, so kept light)."""

from __future__ import annotations

import os
import time

import numpy as np
import ray
import ray.util.collective as col

import minidist.ray


@ray.remote(num_cpus=0)
class Member:
    """One actor of a Ray collective group on the "minidist" backend."""

    def __init__(self, timeout: float = 60.0) -> None:
        minidist.ray.set_timeout(timeout)

    def set_timeout(self, timeout: float) -> None:
        minidist.ray.set_timeout(timeout)

    def pid(self) -> int:
        return os.getpid()

    def join(self, world_size: int, rank: int, name: str) -> int:
        col.init_collective_group(world_size, rank, backend="minidist", group_name=name)
        return col.get_rank(name)

    def leave(self, name: str) -> None:
        col.destroy_collective_group(name)

    def reset(self) -> None:
        """Destroy every group this actor still holds."""
        for job in minidist.ray.describe():
            for name in job["groups"]:
                col.destroy_collective_group(name)

    def describe(self) -> list[dict]:
        return minidist.ray.describe()

    def size(self, name: str) -> int:
        return col.get_collective_group_size(name)

    # ------------------------------------------------------------------ the checks

    def numpy_suite(self, name: str) -> dict:
        """Every collective on numpy arrays; the results, checked by the caller."""
        r, n = col.get_rank(name), col.get_collective_group_size(name)
        out: dict = {}
        x = np.full(1000, r + 1, np.float32)
        col.allreduce(x, name)
        out["allreduce"] = float(x[0])
        big = np.full(1 << 21, r + 1, np.float32)  # 8 MiB: the large-message paths
        col.allreduce(big, name)
        out["allreduce_big"] = [float(big.min()), float(big.max())]
        x = np.array([r + 1], np.int64)
        col.allreduce(x, name, op=col.types.ReduceOp.MAX)
        out["allreduce_max"] = int(x[0])
        x = np.array([float(r + 2)])
        col.allreduce(x, name, op=col.types.ReduceOp.PRODUCT)
        out["allreduce_prod"] = float(x[0])
        b = np.arange(10, dtype=np.float64) * (r + 1)
        col.broadcast(b, src_rank=n - 1, group_name=name)
        out["broadcast"] = b.tolist()
        outs = [np.zeros((2, 3), np.int32) for _ in range(n)]
        col.allgather(outs, np.full((2, 3), r, np.int32), name)
        out["allgather"] = [int(o[0, 0]) for o in outs] + [outs[0].shape]
        ins = [np.full(5, 10 * r + i, np.float64) for i in range(n)]
        mine = np.zeros(5, np.float64)
        col.reducescatter(mine, ins, name)
        out["reducescatter"] = float(mine[0])
        out["reducescatter_inputs_kept"] = [float(a[0]) for a in ins]
        red = np.full(4, r + 1, np.int32)
        col.reduce(red, dst_rank=1, group_name=name)
        out["reduce"] = int(red[0])
        col.barrier(name)
        # a ring of sends: rank r sends to r + 1 and receives from r - 1
        got = np.zeros(3, np.float32)
        if r % 2 == 0:
            col.send(np.full(3, r, np.float32), (r + 1) % n, name)
            col.recv(got, (r - 1) % n, name)
        else:
            col.recv(got, (r - 1) % n, name)
            col.send(np.full(3, r, np.float32), (r + 1) % n, name)
        out["recv"] = float(got[0])
        return out

    def torch_suite(self, name: str) -> dict:
        """Every collective on CPU torch tensors."""
        import torch

        r, n = col.get_rank(name), col.get_collective_group_size(name)
        out: dict = {}
        x = torch.full((64, 3), float(r + 1))
        col.allreduce(x, name)
        out["allreduce"] = float(x[0, 0])
        w = torch.zeros(2, 3)[:, ::2]  # not contiguous
        w.fill_(r + 1)
        col.broadcast(w, src_rank=0, group_name=name)
        out["broadcast_strided"] = w.flatten().tolist()
        h = torch.full((4,), float(r), dtype=torch.bfloat16)  # no numpy dtype: as int16
        col.broadcast(h, src_rank=2, group_name=name)
        out["broadcast_bf16"] = float(h[0])
        g = torch.full((3,), float(r), requires_grad=True)
        outs = [torch.zeros(3) for _ in range(n)]
        col.allgather(outs, g, name)
        out["allgather"] = [float(o[0]) for o in outs]
        ins = [torch.full((2,), float(r * 10 + i)) for i in range(n)]
        mine = torch.zeros(2)
        col.reducescatter(mine, ins, name, op=col.types.ReduceOp.MIN)
        out["reducescatter_min"] = float(mine[0])
        red = torch.full((2,), r + 1, dtype=torch.int32)
        col.reduce(red, dst_rank=0, group_name=name)
        out["reduce"] = int(red[0])
        col.barrier(name)
        got = torch.zeros(2, dtype=torch.float64)
        if r == 0:
            col.send(torch.ones(2, dtype=torch.float64) * 7, n - 1, name)
        elif r == n - 1:
            col.recv(got, 0, name)
        out["recv"] = float(got[0])
        return out

    def allreduce(self, name: str, value: float, size: int = 16) -> float:
        x = np.full(size, value, np.float64)
        col.allreduce(x, name)
        return float(x[0])

    def broadcast(self, name: str, value: float, src: int) -> float:
        x = np.full(4, value, np.float64)
        col.broadcast(x, src_rank=src, group_name=name)
        return float(x[0])

    def allreduce_raises(self, name: str) -> tuple[str, str, float]:
        """An allreduce that cannot finish (a member is gone): (error type, message,
        seconds until it raised)."""
        x = np.ones(8, np.float32)
        t = time.monotonic()
        try:
            col.allreduce(x, name)
            col.allreduce(x, name)
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            return type(e).__name__, str(e), time.monotonic() - t
        return "", "", time.monotonic() - t
