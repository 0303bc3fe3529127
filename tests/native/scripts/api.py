"""The public calls end to end on CPU tensors, with only the CUDA-specific pieces
stubbed: the tensor check, the device record (argv[1]: ``host`` forces host staging,
``ipc`` makes ranks 0 and 1 share a GPU so the group takes CUDA IPC, over host shared
memory), and, with argv[2] == ``die``, rank 2 dies mid-job: the next call on the group
raises PeerLostError and every later call says the group is unusable."""

import os
import sys
import time

import torch

import minidist
import minidist_native
from minidist import ReduceOp
from minidist_native import _api, _context
from minidist_native._ipc import HostSlots, IpcPath
from minidist_native._records import DeviceRecord

mode = sys.argv[1]
die = len(sys.argv) > 2 and sys.argv[2] == "die"
_api._cuda = lambda t, what: t  # CPU tensors stand in for CUDA tensors


def record(rank, node, device):
    uuid = "GPU-shared" if mode == "ipc" and rank < 2 else f"GPU-{rank}"
    return DeviceRecord(rank=rank, node=node, machine=_context.machine_id(), uuid=uuid,
                        index=device, nccl="", ipc=(mode == "ipc"),
                        force="host" if mode == "host" else "")


def host_slots_ipc(self, key, group, ranks, me, timeout, ex):
    slots = HostSlots(1 << 16, "api-")
    slots.attach(ex.share_blobs(slots.export()), me)
    minidist.barrier(group)
    slots.unlink()
    return IpcPath(slots, me, len(ranks), lambda: minidist.barrier(group))


_context.local_record = record
_context.Context._ipc = host_slots_ipc

minidist.init(timeout=30)
rank, n = minidist.get_rank(), minidist.get_world_size()

t = torch.full((1000,), float(rank + 1))
minidist_native.all_reduce(t)
assert torch.all(t == n * (n + 1) / 2), t[:4]
w = minidist_native.all_reduce(t, ReduceOp.MAX, async_op=True)
assert isinstance(w, minidist_native.NativeWork) and w.wait() and w.is_completed()
b = torch.arange(10.0) * (rank + 1)
minidist_native.broadcast(b, src=n - 1)
assert torch.equal(b, torch.arange(10.0) * n), b
r = torch.ones(4, dtype=torch.int32) * (rank + 1)
minidist_native.reduce(r, dst=1, op=ReduceOp.SUM)
assert torch.equal(r, torch.full((4,), n * (n + 1) // 2 if rank == 1 else rank + 1,
                                 dtype=torch.int32)), r
out = torch.empty(3 * n, dtype=torch.bfloat16)
minidist_native.all_gather(out, torch.full((3,), rank, dtype=torch.bfloat16))
assert torch.equal(out, torch.arange(n).repeat_interleave(3).to(torch.bfloat16)), out
rs = torch.empty(2)
minidist_native.reduce_scatter(rs, torch.arange(2.0 * n))
assert torch.equal(rs, n * torch.arange(2.0 * rank, 2.0 * rank + 2)), rs

sub = minidist.new_group([0, 1])
if rank < 2:
    s = torch.ones(5) * rank
    minidist_native.all_reduce(s, group=sub)
    assert torch.all(s == 1), s
    msg = torch.arange(6.0) if rank == 0 else torch.zeros(6)
    if rank == 0:
        minidist_native.send(msg, 1)
    else:
        minidist_native.recv(msg, 0)
        assert torch.equal(msg, torch.arange(6.0)), msg
for c in minidist_native.communicators():
    print(f"COMM {c['path']} {c['key']} | {c['reason']}", flush=True)
try:
    minidist_native.broadcast(torch.zeros(1), src=n + 5)
except ValueError as e:
    print(f"BADROOT {e}", flush=True)

if die:
    minidist.barrier()
    if rank == 2:
        os._exit(1)
    time.sleep(0.5)
    x = torch.ones(100)
    t0 = time.monotonic()
    try:
        minidist_native.all_reduce(x)
        print("NO ERROR", flush=True)
    except minidist.PeerLostError as e:
        print(f"LOST {list(e.ranks)} after={time.monotonic() - t0:.1f}", flush=True)
    try:
        minidist_native.all_reduce(x)
    except minidist.DistError as e:
        print(f"AGAIN {type(e).__name__} {e}", flush=True)
    sys.exit(0)
print("OK", flush=True)
minidist.destroy()
