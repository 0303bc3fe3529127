"""Loop on all_reduce until a host is cut off; print what the survivors see."""

import sys
import time

import numpy as np

import minidist

minidist.init(timeout=60)
minidist.barrier()
print("READY", flush=True)
x = np.ones(1000)
t0 = time.monotonic()
last_ok = t0
try:
    while time.monotonic() - t0 < 60:
        minidist.all_reduce(x)
        last_ok = time.monotonic()
        time.sleep(0.01)
except minidist.PeerLostError as e:
    print(f"LOST ranks={','.join(map(str, e.ranks))} after={time.monotonic() - last_ok:.2f} "
          f"msg={e}", flush=True)
    sys.exit(3)
except minidist.DistError as e:
    print(f"OTHER {type(e).__name__} {e}", flush=True)
    sys.exit(4)
print("NO ERROR", flush=True)
