"""minidist.scan in real processes: every op and dtype, both algorithms, inclusive and
exclusive, blocking and async, numpy, minidist.aio and minidist.torch (argv[1]: which).
Every rank derives every rank's input from one seed and checks its own result."""

from __future__ import annotations

import asyncio
import sys

import numpy as np

import minidist
from minidist import ReduceOp, ops
from tests.unit.test_scan import UFUNC, inputs, reference  # the simulator tests' own


def want(xs, r, op, exclusive):
    return reference(xs, op, exclusive)[r]


def cases():
    k = 0
    for op in UFUNC:
        for dt in ops.DTYPES:
            try:
                ops.check_op(op, dt)
            except TypeError:
                continue
            for exclusive in (False, True):
                k += 1
                yield k, op, dt, exclusive, ("linear", "recursive_doubling")[k % 2], \
                    (1, 7, 1000)[k % 3]


def main_numpy():
    minidist.init()
    r, n = minidist.get_rank(), minidist.get_world_size()
    done = 0
    for k, op, dt, exclusive, algo, count in cases():
        xs = inputs(n, count, dt, op, k)
        x = xs[r].copy()
        if k % 5 == 0:
            w = minidist.scan(x, op=op, exclusive=exclusive, algorithm=algo, async_op=True)
            w.wait()
        else:
            assert minidist.scan(x, op, None, False, algo, exclusive=exclusive) is None
        assert np.array_equal(x, want(xs, r, op, exclusive)), (k, op, dt, exclusive, x)
        done += 1
    # a non-contiguous array, a subgroup, and bad input that changes nothing
    m = np.arange(12, dtype=np.int32).reshape(3, 4) + r
    col = m[:, 1]
    minidist.scan(col)
    assert col.tolist() == [sum(1 + 4 * i + q for q in range(r + 1)) for i in range(3)]
    g = minidist.new_group(list(range(1, n)))
    if r >= 1:
        y = np.full(3, r, np.int64)
        minidist.scan(y, group=g, exclusive=True)
        assert y.tolist() == [sum(range(1, r))] * 3, y
    z = np.ones(3)
    for bad, kw in ((ValueError, {"op": ReduceOp.AVG}), (TypeError, {"inclusive": True}),
                    (TypeError, {"op": ReduceOp.BAND})):
        try:
            minidist.scan(z, **kw)
        except bad:
            pass
        else:
            raise AssertionError(f"scan(**{kw}) did not raise {bad.__name__}")
        assert z.tolist() == [1.0, 1.0, 1.0]
    minidist.barrier()
    print(f"SCAN OK numpy {done}", flush=True)
    minidist.destroy()


def main_aio():
    import minidist.aio as dist

    async def run():
        await dist.init()
        r, n = dist.get_rank(), dist.get_world_size()
        done = 0
        for k, op, dt, exclusive, algo, count in cases():
            if k % 3:
                continue
            xs = inputs(n, count, dt, op, k)
            x = xs[r].copy()
            if k % 2:
                h = await dist.scan(x, op=op, exclusive=exclusive, async_op=True)
                await h.wait()
            else:
                await dist.scan(x, op=op, exclusive=exclusive, algorithm=algo)
            assert np.array_equal(x, want(xs, r, op, exclusive)), (k, op, dt, x)
            done += 1
        print(f"SCAN OK aio {done}", flush=True)
        await dist.destroy()

    asyncio.run(run())


def main_torch():
    import torch

    import minidist.torch as dist

    dist.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    done = 0
    for dt, tdt in ((np.float32, torch.float32), (np.int64, torch.int64)):
        for op in (ReduceOp.SUM, ReduceOp.MAX, dist.ReduceOp.MIN):
            for exclusive in (False, True):
                xs = inputs(n, 6, np.dtype(dt), op, done)
                t = torch.from_numpy(xs[r].copy()).to(tdt)
                w = dist.scan(t, op=op, exclusive=exclusive, async_op=bool(done % 2))
                if w is not None:
                    w.wait()
                assert np.array_equal(t.numpy(), want(xs, r, op, exclusive)), (dt, op, t)
                done += 1
    bf = torch.arange(4, dtype=torch.bfloat16) + r  # through a float32 copy
    dist.scan(bf)
    assert bf.float().tolist() == [float(sum(i + q for q in range(r + 1))) for i in range(4)]
    print(f"SCAN OK torch {done + 1}", flush=True)
    dist.destroy_process_group()


{"numpy": main_numpy, "aio": main_aio, "torch": main_torch}[sys.argv[1]]()
