"""init_process_group's ways in, one after the other in the same processes (each
followed by destroy_process_group): env:// as processes started by hand use it
(MASTER_ADDR / MASTER_PORT with rank= and world_size=), tcp://, file://; and every
dtype torch.distributed moves on CPU. ``init_methods.py PORT1 PORT2 DIR`` in a
torchrun-like environment (RANK and WORLD_SIZE are read, then removed)."""

from __future__ import annotations

import os
import sys

import torch

import minidist
import minidist.torch as dist

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.complex64, torch.complex128]


def check_dtypes(r: int, n: int) -> None:
    for dt in DTYPES:
        t = torch.ones(3, dtype=dt)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if dt == torch.bool else dist.ReduceOp.SUM)
        want = torch.full((3,), 1 if dt == torch.bool else n).to(dt)
        assert torch.equal(t, want), (dt, t)
        b = (torch.arange(3) + r).to(dt)
        dist.broadcast(b, src=n - 1)
        assert torch.equal(b, (torch.arange(3) + n - 1).to(dt)), (dt, b)


def main() -> None:
    port1, port2, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        os.environ.pop(var)
    os.environ["MASTER_PORT"] = port1
    dist.init_process_group("gloo", rank=r, world_size=n)
    check_dtypes(r, n)
    dist.destroy_process_group()

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port2}", rank=r,
                            world_size=n)
    check_dtypes(r, n)
    dist.destroy_process_group()

    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=r, world_size=n)
    assert minidist.get_rank() == r
    check_dtypes(r, n)
    dist.destroy_process_group()
    print(f"rank {r}: init methods ok", flush=True)


if __name__ == "__main__":
    main()
