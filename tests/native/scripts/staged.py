"""Every collective of a CPU-testable path against a reference, in a real job.

argv[1]: ``host`` (host staging), ``mixed`` (host staging on every rank but the last,
which is a CPU rank using minidist.torch: the staged calls must meet its calls on the
wire), ``ipc`` (the CUDA IPC algorithm over host shared memory; argv[2] is the slot
size in bytes). Tensors are CPU tensors standing in for CUDA ones: what is tested is
the staging, the dtypes, the slots, the chunks and the reductions.
"""

import sys
import time

import torch

import minidist
from minidist import ReduceOp
from minidist_native import _dtypes
from minidist_native._exchange import Exchange
from minidist_native._host import HostPath
from minidist_native._ipc import HostSlots, IpcPath, regrow
from minidist_native._keys import Ordinals, group_key

mode = sys.argv[1]
minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
ranks = tuple(range(n))
cpu_rank = mode == "mixed" and rank == n - 1

if cpu_rank:
    import minidist.torch as mdt

    class Adapter:
        """A CPU rank's calls, through minidist.torch."""

        name = "cpu"

        def all_reduce(self, t, op):
            mdt.all_reduce(t, op)

        def broadcast(self, t, root):
            mdt.broadcast(t, root)

        def reduce(self, t, op, root):
            mdt.reduce(t, root, op)

        def all_gather(self, out, inp):
            mdt.all_gather_into_tensor(out, inp)

        def reduce_scatter(self, out, inp, op):
            mdt.reduce_scatter_tensor(out, inp, op)

        def send(self, t, peer):
            mdt.send(t, peer)

        def recv(self, t, peer):
            mdt.recv(t, peer)

    path = Adapter()
elif mode in ("host", "mixed"):
    path = HostPath(None, ranks)
elif mode == "ipc":
    capacity = int(sys.argv[2])
    slots = HostSlots(capacity, "test-")
    ex = Exchange(minidist.get_store(), Ordinals().next(group_key(0, ranks, 0)), ranks, rank,
                  time.monotonic() + 30, "ipc test")
    slots.attach(ex.share_blobs(slots.export()), rank)
    minidist.barrier()
    slots.unlink()  # every member has mapped every slot
    grow = None
    if len(sys.argv) > 3:  # slots that start at `capacity` and grow up to argv[3] bytes
        ordinals = Ordinals()

        def grow(capacity):
            grown = Exchange(minidist.get_store(), ordinals.next(group_key(1, ranks, 0)),
                             ranks, rank, time.monotonic() + 30, "ipc test growth")
            new = regrow(path.slots, lambda c: HostSlots(c, "test-"), grown.share_blobs,
                         capacity, rank)
            minidist.barrier()
            new.unlink()
            grown.finish()
            return new

    path = IpcPath(slots, rank, n, lambda: minidist.barrier(), grow=grow,
                   cap=int(sys.argv[3]) if len(sys.argv) > 3 else 0)
else:
    raise SystemExit(f"unknown mode {mode}")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
          torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]
if mode == "mixed":  # keep the CPU rank's calls few: it runs the torch adapter
    DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]
MOVE_ONLY = [torch.float8_e4m3fn] if hasattr(torch, "float8_e4m3fn") else []


def value(r, dtype, numel, salt=0):
    base = (torch.arange(numel, dtype=torch.int64) * (r + 3) + r + salt) % 7
    if dtype == torch.bool:
        return base % 3 == 0
    if dtype.is_complex:
        return torch.complex(base.float(), (base % 2).float()).to(dtype)
    return base.to(dtype)


def ops_for(dtype):
    out = [ReduceOp.SUM, ReduceOp.PRODUCT]
    if not dtype.is_complex:
        out += [ReduceOp.MIN, ReduceOp.MAX]
    if dtype.is_floating_point or dtype.is_complex:
        out.append(ReduceOp.AVG)
    else:
        out += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    if mode == "mixed":
        out = out[:2] + out[-1:]
    return out


def reference(dtype, op, numel, salt=0):
    parts = [value(r, dtype, numel, salt) for r in range(n)]
    out = torch.empty_like(parts[0])
    _dtypes.reduce_into(out, parts, op)
    return out


def same(got, want, what, op=None):
    if op == ReduceOp.AVG or got.dtype in (torch.float16, torch.bfloat16):
        ok = torch.allclose(got.to(torch.complex128 if got.is_complex() else torch.float64),
                            want.to(torch.complex128 if want.is_complex() else torch.float64),
                            rtol=1e-2, atol=1e-2)
    elif got.dtype.is_floating_point and got.element_size() == 1:
        ok = torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    else:
        ok = torch.equal(got, want)
    if not ok:
        raise AssertionError(f"rank {rank} {mode} {what}: got {got.flatten()[:12]} want "
                             f"{want.flatten()[:12]}")


checks = 0
sizes = (0, 1, 5, 1000, 70_000)
if mode == "mixed":
    sizes = (1, 1000)
elif mode == "ipc" and capacity < 65536:  # many small chunks: keep the job short
    sizes = (0, 1, 5, 1000, 3000)
for dtype in DTYPES:
    for numel in sizes:
        for op in ops_for(dtype):
            t = value(rank, dtype, numel)
            path.all_reduce(t, op)
            same(t, reference(dtype, op, numel), f"all_reduce {dtype} {op.name} n={numel}", op)
            checks += 1
        for root in range(n):
            t = value(rank, dtype, numel, salt=root)
            path.broadcast(t, root)
            same(t, value(root, dtype, numel, salt=root), f"broadcast {dtype} root={root}")
            checks += 1
        for root in range(n):
            op = ReduceOp.MAX if not dtype.is_complex else ReduceOp.SUM
            t = value(rank, dtype, numel, salt=1)
            path.reduce(t, op, root)
            want = reference(dtype, op, numel, salt=1) if rank == root \
                else value(rank, dtype, numel, salt=1)
            same(t, want, f"reduce {dtype} root={root}", op)
            checks += 1
        inp = value(rank, dtype, numel, salt=2)
        out = torch.empty(n * numel, dtype=dtype)
        path.all_gather(out, inp)
        same(out, torch.cat([value(r, dtype, numel, salt=2) for r in range(n)]),
             f"all_gather {dtype} n={numel}")
        checks += 1
        for op in ops_for(dtype)[:2]:
            inp = value(rank, dtype, n * numel, salt=3)
            out = torch.empty(numel, dtype=dtype)
            path.reduce_scatter(out, inp, op)
            full = reference(dtype, op, n * numel, salt=3)
            same(out, full[rank * numel:(rank + 1) * numel],
                 f"reduce_scatter {dtype} {op.name} n={numel}", op)
            checks += 1

# dtypes that can only be moved
for dtype in MOVE_ONLY:
    if mode == "mixed":
        break
    for root in range(n):
        t = value(rank, torch.float32, 300, salt=root).to(dtype)
        path.broadcast(t, root)
        same(t, value(root, torch.float32, 300, salt=root).to(dtype), f"broadcast {dtype}")
        checks += 1

# a non-contiguous tensor, reduced in place
t = value(rank, torch.float32, 600).view(20, 30).t()
path.all_reduce(t, ReduceOp.SUM)
same(t, reference(torch.float32, ReduceOp.SUM, 600).view(20, 30).t(), "all_reduce strided")
checks += 1

# point-to-point around a ring (paths that have it)
if hasattr(path, "send"):
    for dtype in (torch.float32, torch.bfloat16, torch.int16):
        t = value(rank, dtype, 257)
        got = torch.zeros_like(t)
        left, right = (rank - 1) % n, (rank + 1) % n
        if rank % 2 == 0:
            path.send(t, right)
            path.recv(got, left)
        else:
            path.recv(got, left)
            path.send(t, right)
        same(got, value(left, dtype, 257), f"send/recv {dtype}")
        checks += 1

if mode == "ipc":
    print(f"CHUNKS {path.chunks} TWO_PHASE {path.two_phase} GROWN {path.grown} "
          f"CAPACITY {path.slots.capacity}", flush=True)
print(f"OK {checks}", flush=True)
minidist.destroy()
