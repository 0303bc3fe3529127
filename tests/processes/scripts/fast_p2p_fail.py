"""A receive waiting in its inbox when the sender fails (argv[1]):

* ``kill``: rank 1 SIGKILLs itself in the middle of a ping-pong with rank 0;
* ``leave``: rank 1 sends three messages, then leaves the job; rank 0 receives all
  three, then its next receive fails;
* ``silent``: rank 1 sends nothing for a while; rank 0's receive times out (on a group
  with a 2 s timeout), and its next receive takes the message that comes later.

Rank 0 prints what it saw, with the seconds the failing receive took."""

import os
import signal
import sys
import time

import numpy as np

import minidist

what = sys.argv[1]
minidist.init(timeout=60)
rank = minidist.get_rank()
x = np.zeros(4, np.float32)


def ping_pong(rounds: int, die_at: int = -1) -> None:
    """Rank 0 sends, rank 1 sends back; rank 1 SIGKILLs itself at round ``die_at``."""
    for i in range(rounds):
        if rank == 1 and i == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 0:
            minidist.send(x, 1)
            minidist.recv(x, 1)
        else:
            minidist.recv(x, 0)
            minidist.send(x, 0)


ping_pong(200)  # the inboxes are set up and in use

if what == "kill":
    t0 = time.monotonic()
    try:
        ping_pong(100_000, die_at=50)
        print("NO ERROR", flush=True)
    except minidist.PeerLostError as e:
        print(f"LOST {list(e.ranks)} {time.monotonic() - t0:.1f}", flush=True)
        os._exit(3)
elif what == "leave":
    if rank == 1:
        for k in range(3):
            minidist.send(np.full(4, k, np.float32), 0, tag=4)
        minidist.destroy()
        sys.exit(0)
    for k in range(3):
        minidist.recv(x, 1, tag=4)
        assert (x == k).all(), (k, x)
    t0 = time.monotonic()
    try:
        minidist.recv(x, 1, tag=4)
        print("NO ERROR", flush=True)
    except minidist.PeerLostError as e:
        print(f"LEFT {list(e.ranks)} {e.left} {time.monotonic() - t0:.1f}", flush=True)
        os._exit(3)
elif what == "silent":
    g = minidist.new_group([0, 1], timeout=2)
    if rank == 1:  # after the first receive's 2 s, well before the second one's end
        time.sleep(3)
        minidist.send(np.full(4, 7, np.float32), 0, group=g)
    else:
        t0 = time.monotonic()
        try:
            minidist.recv(x, 1, group=g)
            print("NO ERROR", flush=True)
        except minidist.DistTimeoutError as e:
            print(f"TIMEOUT {time.monotonic() - t0:.1f} {e}", flush=True)
        minidist.recv(x, 1, group=g)  # the same message number again: it comes later
        print(f"LATER {x[0]:g}", flush=True)
    minidist.barrier()
minidist.destroy()
