"""Every collective and point-to-point call, in every dtype, through three paths:
``minidist.torch`` (the drop-in module), torch.distributed with gloo, and
torch.distributed with the registered "minidist" backend. Each rank saves what each
path produced (``OUT/<path>_rank<r>.npz``) for the test to compare.

Run under ``minidist run -n N differential.py OUT``.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as tdist

import minidist.torch as mdist

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
          "bfloat16": torch.bfloat16, "float16": torch.float16}


def values(rank: int, dtype: torch.dtype, shape: tuple[int, ...], salt: int,
           positive: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * salt + 104729 * rank + 1)
    if dtype.is_floating_point:
        x = torch.rand(shape, generator=g, dtype=torch.float64)
        x = x + 0.5 if positive else x * 2 - 1
        return x.to(dtype)
    if positive:
        return torch.randint(1, 4, shape, generator=g, dtype=dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def noncontig(t: torch.Tensor, allowed: bool) -> torch.Tensor:
    """``t``'s values in a transposed (non-contiguous) layout, when allowed."""
    if not allowed or t.dim() != 2:
        return t
    return t.t().contiguous().t()


def run_all(dist, out: dict[str, np.ndarray], nc_ok: bool) -> None:
    r, n = dist.get_rank(), dist.get_world_size()
    RO = dist.ReduceOp

    def keep(key: str, t) -> None:
        if isinstance(t, (list, tuple)):
            t = torch.stack([x.reshape(-1) for x in t]) if t else torch.empty(0)
        t = t.detach()
        out[key] = (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()

    evens = list(range(0, n, 2))
    sub = dist.new_group(evens)
    for dn, dt in DTYPES.items():
        ops = [("SUM", RO.SUM, False), ("MIN", RO.MIN, False), ("MAX", RO.MAX, False),
               ("PRODUCT", RO.PRODUCT, True)]
        if not dt.is_floating_point:
            ops += [("BAND", RO.BAND, False), ("BOR", RO.BOR, False), ("BXOR", RO.BXOR, False)]
        for name, op, pos in ops:
            t = values(r, dt, (7, 3), hash(name) % 97, pos)
            dist.all_reduce(t, op=op)
            keep(f"{dn}/all_reduce/{name}", t)
        t = noncontig(values(r, dt, (4, 6), 1), nc_ok)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        keep(f"{dn}/all_reduce/SUM_noncontig_async", t)

        t = noncontig(values(r, dt, (3, 5), 2), nc_ok)
        dist.broadcast(t, src=n - 1)
        keep(f"{dn}/broadcast", t)

        t = values(r, dt, (9,), 3)
        dist.reduce(t, dst=1 % n, op=RO.SUM)
        if r == 1 % n:
            keep(f"{dn}/reduce", t)
        t = values(r, dt, (9,), 4)
        dist.reduce(t, dst=0, op=RO.MAX)
        if r == 0:
            keep(f"{dn}/reduce_max", t)

        x = values(r, dt, (2, 3), 5)
        outs = [torch.empty(2, 3, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, x)
        keep(f"{dn}/all_gather", outs)
        o = torch.empty(2 * n, 3, dtype=dt)
        dist.all_gather_into_tensor(o, x)
        keep(f"{dn}/all_gather_into_tensor", o)

        ins = [values(r, dt, (4,), 10 + j) for j in range(n)]
        o = torch.empty(4, dtype=dt)
        dist.reduce_scatter(o, ins, op=RO.SUM)
        keep(f"{dn}/reduce_scatter", o)
        big = values(r, dt, (n * 3, 2), 6)
        o = torch.empty(3, 2, dtype=dt)
        dist.reduce_scatter_tensor(o, big, op=RO.SUM)
        keep(f"{dn}/reduce_scatter_tensor", o)
        o = torch.empty(3, 2, dtype=dt)
        dist.reduce_scatter_tensor(o, big, op=RO.MAX)
        keep(f"{dn}/reduce_scatter_tensor_max", o)

        x = values(r, dt, (5,), 7)
        gl = [torch.empty(5, dtype=dt) for _ in range(n)] if r == 0 else None
        dist.gather(x, gl, dst=0)
        if r == 0:
            keep(f"{dn}/gather", gl)
        src = n - 1
        sl = [values(r, dt, (2, 2), 20 + j) for j in range(n)] if r == src else None
        o = torch.empty(2, 2, dtype=dt)
        dist.scatter(o, sl, src=src)
        keep(f"{dn}/scatter", o)

        ins = [values(r, dt, (2,), 30 + j) for j in range(n)]  # gloo: equal sizes only
        outs = [torch.empty(2, dtype=dt) for i in range(n)]
        dist.all_to_all(outs, ins)
        keep(f"{dn}/all_to_all", torch.cat(outs))

        x = values(r, dt, (2 * n, 3), 8)
        o = torch.empty(2 * n, 3, dtype=dt)
        dist.all_to_all_single(o, x)
        keep(f"{dn}/all_to_all_single", o)
        in_splits = [(r + j) % 3 + 1 for j in range(n)]
        out_splits = [(i + r) % 3 + 1 for i in range(n)]
        x = values(r, dt, (sum(in_splits), 2), 9)
        o = torch.empty(sum(out_splits), 2, dtype=dt)
        dist.all_to_all_single(o, x, out_splits, in_splits)
        keep(f"{dn}/all_to_all_single_uneven", o)

        x = values(r, dt, (6,), 40)
        o = torch.empty(6, dtype=dt)
        reqs = [dist.isend(x, (r + 1) % n), dist.irecv(o, (r - 1) % n)]
        for q in reqs:
            q.wait()
        keep(f"{dn}/isend_irecv_ring", o)
        x = values(r, dt, (2, 3), 41)
        o = noncontig(torch.zeros(2, 3, dtype=dt), nc_ok)
        ops = [dist.P2POp(dist.isend, x, (r - 1) % n, tag=5),
               dist.P2POp(dist.irecv, o, (r + 1) % n, tag=5)]
        for q in dist.batch_isend_irecv(ops):
            q.wait()
        keep(f"{dn}/batch_isend_irecv", o)
        x = values(r, dt, (3,), 42)
        if r % 2 == 0 and r + 1 < n:
            dist.send(x, r + 1, tag=2)
        elif r % 2 == 1:
            o = torch.zeros(3, dtype=dt)
            got = dist.recv(o, r - 1, tag=2)
            keep(f"{dn}/send_recv", o)
            keep(f"{dn}/recv_source", torch.tensor([got]))

        if r in evens:
            t = values(r, dt, (5,), 43)
            dist.all_reduce(t, op=RO.MAX, group=sub)
            keep(f"{dn}/group_all_reduce", t)
            t = values(r, dt, (5,), 44)
            dist.broadcast(t, src=evens[-1], group=sub)
            keep(f"{dn}/group_broadcast", t)
        dist.barrier()

    objs = [{"rank": r, "x": [r] * r}, f"s{r}", None]
    dist.broadcast_object_list(objs, src=n - 1)
    out["obj/broadcast"] = np.array([repr(objs)])
    got = [None] * n
    dist.all_gather_object(got, ("r", r, {r: r * 1.5}))
    out["obj/all_gather"] = np.array([repr(got)])
    got = [None] * n if r == 0 else None
    dist.gather_object({"from": r}, got, dst=0)
    if r == 0:
        out["obj/gather"] = np.array([repr(got)])
    got = [None]
    dist.scatter_object_list(got, [f"to{j}" for j in range(n)] if r == 0 else None, src=0)
    out["obj/scatter"] = np.array([repr(got)])
    if r % 2 == 0 and r + 1 < n:
        dist.send_object_list([r, "x" * r, {"k": r}], dst=r + 1)
    elif r % 2 == 1:
        got = [None] * 3
        dist.recv_object_list(got, src=r - 1)
        out["obj/send_recv"] = np.array([repr(got)])
    dist.barrier()


def main() -> None:
    outdir = sys.argv[1]
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)

    # 1. the drop-in module
    res: dict[str, np.ndarray] = {}
    mdist.init_process_group("gloo")
    run_all(mdist, res, nc_ok=True)
    mdist.destroy_process_group()
    np.savez(os.path.join(outdir, f"minidist_rank{rank}.npz"), **res)

    # 2. torch's own gloo
    res = {}
    tdist.init_process_group("gloo", init_method=f"file://{outdir}/gloo.store", rank=rank,
                             world_size=n)
    run_all(tdist, res, nc_ok=False)
    tdist.destroy_process_group()
    np.savez(os.path.join(outdir, f"gloo_rank{rank}.npz"), **res)

    # 3. torch.distributed with the "minidist" backend
    res = {}
    tdist.init_process_group("minidist", init_method=f"file://{outdir}/md.store", rank=rank,
                             world_size=n)
    assert tdist.get_backend() == "minidist"
    run_all(tdist, res, nc_ok=True)
    tdist.destroy_process_group()
    np.savez(os.path.join(outdir, f"backend_rank{rank}.npz"), **res)
    print(f"rank {rank}: {len(res)} results per path", flush=True)


if __name__ == "__main__":
    main()
