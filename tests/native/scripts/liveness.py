"""The peer watch that NCCL waits rely on: argv[1] ``dies`` (rank 1 exits hard; the
others' watches must fire with PeerLostError naming it) or ``leaves`` (everyone
watches everyone, then leaves normally: nothing may hang)."""

import os
import sys
import threading
import time

import minidist
from minidist_native._liveness import PeerWatch

scenario = sys.argv[1]
minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
fired = threading.Event()
seen = {}


def on_lost(peer, error):
    seen["peer"], seen["error"] = peer, error
    fired.set()


watch = PeerWatch(minidist.api.door())
watch.watch([r for r in range(n) if r != rank], on_lost)
minidist.barrier()
if scenario == "dies":
    if rank == 1:
        time.sleep(0.3)
        os._exit(1)
    t0 = time.monotonic()
    ok = fired.wait(30)
    e = seen.get("error")
    print(f"FIRED {ok} peer={seen.get('peer')} type={type(e).__name__} "
          f"ranks={list(getattr(e, 'ranks', ()))} left={getattr(e, 'left', None)} "
          f"after={time.monotonic() - t0:.1f}", flush=True)
    lost = watch.lost([1])
    print(f"KNOWN {type(lost).__name__}", flush=True)
    sys.exit(0)
minidist.barrier()
t0 = time.monotonic()
minidist.destroy()
print(f"LEFT after={time.monotonic() - t0:.1f}", flush=True)
