"""A receive waiting in its inbox when the sender fails (argv[1]):

* ``kill``: rank 1 SIGKILLs itself in the middle of a ping-pong with rank 0;
* ``leave``: rank 1 sends three messages, then leaves the job; rank 0 receives all
  three, then its next receive fails;
* ``silent``: rank 1 sends nothing for a while; rank 0's receive times out (on a group
  with a 2 s timeout), and its next receive takes the message that comes later;
* ``leave_large``: rank 1 sends three messages that wait in its stash, then leaves; rank
  0 looks only a second later (rank 1's destroy had its loop take them), receives all
  three, then its next receive fails;
* ``kill_large``: rank 1 sends two messages that wait in its stash, then SIGKILLs
  itself; rank 0 receives both from the dead process's stash, then its next receive
  fails;
* ``stopped_large``: rank 1 stops rank 0 (SIGSTOP), sends a message that waits in its
  stash and leaves: nobody takes it within the linger, so the stash goes; rank 0,
  continued, fails the receive of that message (PeerLostError, not a hang).

Rank 0 prints what it saw, with the seconds the failing receive took."""

import os
import signal
import sys
import threading
import time

import numpy as np

import minidist
from minidist.shm.p2p import LINGER

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
elif what in ("leave_large", "kill_large", "stopped_large"):
    big = 1 << 20
    pids = minidist.all_gather_object(os.getpid())  # (which receives on the loop)
    sends = {"leave_large": 3, "kill_large": 2, "stopped_large": 1}[what]
    if rank == 1:
        time.sleep(0.3)  # rank 0 waits in its inbox
        wake = threading.Timer(LINGER + 2, os.kill, (pids[0], signal.SIGCONT))
        if what == "stopped_large":
            os.kill(pids[0], signal.SIGSTOP)
            wake.start()
        minidist.send(x, 0, tag=3)
        for k in range(sends):
            minidist.send(np.full(big, k + 1, np.uint8), 0, tag=4)
        if what == "kill_large":
            os.kill(os.getpid(), signal.SIGKILL)
        minidist.destroy()
        if wake.is_alive():
            wake.join()  # (the launcher's ranks end with os._exit: no thread is waited for)
        sys.exit(0)
    minidist.recv(x, 1, tag=3)  # opens the inbox again
    time.sleep(1.0)
    for k in range(0 if what == "stopped_large" else sends):
        got = np.zeros(big, np.uint8)
        minidist.recv(got, 1, tag=4)
        assert (got == k + 1).all(), (k, got[:4])
    t0 = time.monotonic()
    try:
        minidist.recv(np.zeros(big, np.uint8), 1, tag=4)
        print("NO ERROR", flush=True)
    except minidist.PeerLostError as e:
        print(f"LOST LARGE {list(e.ranks)} {time.monotonic() - t0:.1f} {e}", flush=True)
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
