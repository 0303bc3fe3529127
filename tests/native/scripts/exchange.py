"""The CUDA set-up's exchange over minidist's rendezvous, with synthetic device records.

argv[1] is the scenario: uid (every rank on a GPU of its own: NCCL, the unique id
shared), shared (ranks 0 and 1 on one GPU: CUDA IPC), mixed (the last rank declares
itself host-only), fail (rank 0 cannot make the unique id), missing (the last rank
never joins). With ``real`` as argv[2], group rank 0 makes the unique id with the
installed libnccl.
"""

import hashlib
import os
import sys
import time

import minidist
import minidist_native
from minidist_native import _nccl
from minidist_native._context import machine_id
from minidist_native._exchange import Exchange, SetupFailed
from minidist_native._keys import Ordinals, group_key
from minidist_native._records import DeviceRecord, choose

scenario = sys.argv[1]
real = len(sys.argv) > 2 and sys.argv[2] == "real"
minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
store = minidist.get_store()
door = minidist.api.door()

if scenario == "mixed" and rank == n - 1:
    minidist_native.declare_host()
    minidist.barrier()  # the group's first call, as a CPU rank makes it
    minidist.barrier()
    minidist.destroy()
    sys.exit(0)
if scenario == "missing" and rank == n - 1:
    minidist.barrier()
    minidist.destroy()
    sys.exit(0)

g = minidist.new_group(list(range(n)))
key = group_key(g.id, g.ranks, 0)
names = Ordinals().next(key)
deadline = time.monotonic() + (3.0 if scenario == "missing" else 30.0)
ex = Exchange(store, names, g.ranks, g.rank_of(rank), deadline, f"test on {key}")
uuid = "GPU-shared" if scenario == "shared" and rank < 2 else f"GPU-{rank}"
mine = DeviceRecord(rank=rank, node=door.node_rank, machine=machine_id(), uuid=uuid,
                    index=0, nccl="2.99.0", binding="ctypes", ipc=True)
if scenario == "mixed":
    minidist.barrier()  # the CPU rank's declaration is made before this
t0 = time.monotonic()
failed_early = None
try:
    ex.publish(mine)
    records = ex.gather(mine)
except minidist.DistTimeoutError as e:
    print(f"TIMEOUT missing={list(e.missing)} after={time.monotonic() - t0:.1f} msg={e}",
          flush=True)
    minidist.barrier()
    minidist.destroy()
    sys.exit(0)
except SetupFailed as e:  # another rank failed while this one still gathered records
    failed_early = e
if failed_early is None:
    choice = choose(records)
    print(f"CHOICE {choice.path} | {choice.reason}", flush=True)


def make():
    if scenario == "fail":
        raise RuntimeError("no unique id today")
    if real:
        lib, search = _nccl.load()
        return lib.get_unique_id()
    return os.urandom(128)


t0 = time.monotonic()
try:
    if failed_early is not None:
        raise failed_early
    uid = ex.share_uid(make)
except (SetupFailed, RuntimeError) as e:
    print(f"FAILED {type(e).__name__} after={time.monotonic() - t0:.1f} {e}", flush=True)
    uid = None
if uid is not None:
    print(f"UID {len(uid)} {hashlib.sha256(uid).hexdigest()[:16]}", flush=True)
    ex.finish()
if scenario == "mixed":
    minidist.barrier()
else:
    minidist.barrier(g)
if rank == 0 and uid is not None:
    left = [k for k in names.every(n) if store.check([k])]
    print(f"LEFT {left}", flush=True)
minidist.destroy()
