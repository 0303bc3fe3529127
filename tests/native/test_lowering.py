"""The NCCL communicator's collectives (lowerings, roots, non-contiguous tensors)
against a reference, with NCCL itself replaced by a threaded stand-in that accepts only
what NCCL accepts: the ranks are threads of this process, the tensors CPU tensors."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from minidist import ReduceOp
from minidist_native import _dtypes as D
from minidist_native import _nccl as N
from minidist_native._comm import _Base
from minidist_native._keys import group_key

from .conftest import torch

pytestmark = pytest.mark.timeout(120)

N_RANKS = 3
NCCL_TYPES = {v: k for k, v in D.NCCL_DTYPES.items()}


class Hub:
    def __init__(self, n):
        self.barrier = threading.Barrier(n, timeout=30)
        self.slots = [None] * n

    def exchange(self, me, x):
        self.slots[me] = x.clone()
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        return got


def nccl_reduce(parts, op):
    acc = parts[0].clone()
    for p in parts[1:]:
        if op in (N.SUM, N.AVG):
            acc = acc + p
        elif op == N.PROD:
            acc = acc * p
        elif op == N.MAX:
            acc = torch.maximum(acc, p)
        elif op == N.MIN:
            acc = torch.minimum(acc, p)
    if op == N.AVG:
        acc = acc / len(parts)
    return acc.to(parts[0].dtype)


class FakeNccl(_Base):
    """NCCL's semantics over threads; refuses dtypes NCCL lacks, as NCCL would."""

    def __init__(self, hub, me, n):
        super().__init__(group_key(1, tuple(range(n)), 0), None, tuple(range(n)), me, 0, 10.0)
        self.hub = hub

    def _watch(self, what, keep):
        f = concurrent.futures.Future()
        f.set_result(None)
        return f

    def _typed(self, x, dtype):
        assert x.is_contiguous()
        assert NCCL_TYPES[dtype] == x.dtype, (x.dtype, dtype)

    def _all_reduce(self, x, dtype, op, what):
        self._typed(x, dtype)
        x.copy_(nccl_reduce(self.hub.exchange(self.me, x), op))

    def _broadcast_bytes(self, x, root, what):
        assert x.is_contiguous()
        parts = self.hub.exchange(self.me, x)
        x.copy_(parts[root])

    def _reduce(self, x, dtype, op, root, what):
        self._typed(x, dtype)
        r = nccl_reduce(self.hub.exchange(self.me, x), op)
        if self.me == root:
            x.copy_(r)

    def _all_gather_bytes(self, out, inp, what):
        assert out.is_contiguous() and inp.is_contiguous()
        parts = self.hub.exchange(self.me, inp)
        out.copy_(torch.cat([p.reshape(-1) for p in parts]).view(out.shape))

    def _reduce_scatter(self, out, inp, dtype, op, what):
        self._typed(inp, dtype)
        full = nccl_reduce(self.hub.exchange(self.me, inp), op)
        m = out.numel()
        out.copy_(full.reshape(-1)[self.me * m:(self.me + 1) * m].view(out.shape))


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
          torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]


def value(r, dtype, numel, salt=0):
    base = (torch.arange(numel) * (r + 2) + r + salt) % 5
    if dtype == torch.bool:
        return base % 2 == 0
    if dtype.is_complex:
        return torch.complex(base.float(), (base % 3).float()).to(dtype)
    return base.to(dtype)


def ops_for(dtype):
    ops = [ReduceOp.SUM, ReduceOp.PRODUCT]
    if not dtype.is_complex:
        ops += [ReduceOp.MIN, ReduceOp.MAX]
    if dtype.is_floating_point or dtype.is_complex:
        ops.append(ReduceOp.AVG)
    else:
        ops += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    return ops


def reference(dtype, op, numel, salt=0):
    out = torch.empty(numel, dtype=dtype)
    D.reduce_into(out, [value(r, dtype, numel, salt) for r in range(N_RANKS)], op)
    return out


def close(a, b):
    if a.dtype.is_floating_point or a.dtype.is_complex:
        wide = torch.complex128 if a.is_complex() else torch.float64
        return torch.allclose(a.to(wide), b.to(wide), rtol=1e-2, atol=1e-2)
    return torch.equal(a, b)


def rank_body(comm, me, errors):
    try:
        for dtype in DTYPES:
            for op in ops_for(dtype):
                t = value(me, dtype, 40)
                comm.all_reduce(t, op).result()
                assert close(t, reference(dtype, op, 40)), ("all_reduce", dtype, op, t)
                # a non-contiguous tensor, reduced in place
                s = value(me, dtype, 40).view(5, 8).t()
                comm.all_reduce(s, op).result()
                assert close(s, reference(dtype, op, 40).view(5, 8).t()), \
                    ("all_reduce strided", dtype, op)
            for root in range(N_RANKS):
                t = value(me, dtype, 33, salt=root)
                comm.broadcast(t, root).result()
                assert torch.equal(t, value(root, dtype, 33, salt=root)), ("bcast", dtype)
                op = ops_for(dtype)[-1]
                t = value(me, dtype, 33, salt=1)
                comm.reduce(t, op, root).result()
                want = reference(dtype, op, 33, 1) if me == root else value(me, dtype, 33, 1)
                assert close(t, want), ("reduce", dtype, op, root)
            out = torch.empty(N_RANKS * 7, dtype=dtype)
            comm.all_gather(out, value(me, dtype, 7, salt=2)).result()
            assert torch.equal(out, torch.cat([value(r, dtype, 7, 2) for r in range(N_RANKS)]))
            for op in (ops_for(dtype)[0], ops_for(dtype)[-1]):
                out = torch.empty(6, dtype=dtype)
                comm.reduce_scatter(out, value(me, dtype, 6 * N_RANKS, 3), op).result()
                full = reference(dtype, op, 6 * N_RANKS, 3)
                assert close(out, full[me * 6:(me + 1) * 6]), ("reduce_scatter", dtype, op)
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append((me, e))
        comm.hub.barrier.abort()


def test_every_collective_and_dtype_through_the_lowerings():
    hub = Hub(N_RANKS)
    errors = []
    threads = [threading.Thread(target=rank_body, args=(FakeNccl(hub, r, N_RANKS), r,
                                                         errors)) for r in range(N_RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert not errors, errors[0]


def test_a_failed_communicator_refuses_later_calls():
    import minidist

    comm = FakeNccl(Hub(1), 0, 1)
    comm.abort(minidist.PeerLostError("rank 1 died", ranks=(1,)))
    with pytest.raises(minidist.PeerLostError, match="unusable since a call on it failed"):
        comm.all_reduce(torch.ones(2), ReduceOp.SUM)
