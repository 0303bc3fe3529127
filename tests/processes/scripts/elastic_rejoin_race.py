"""A member dies and is back while the learner takes a newcomer into its group.

Rank 0 (the learner), 1 (a survivor), 2 (a member) and 3 (the newcomer, killed once).
The learner makes the new group of all four while rank 2 is its first process, sends
it to ranks 1 and 2, then rank 2 kills itself and is started again; only once that
new process is admitted does the learner send the group to the newcomer. A
``new_group`` call of its own on the newcomer would now take rank 2's new process (a
group the learner never made: each side's agree would wait for the other until the
timeout); the group it was sent is the learner's. With it, ``agree`` on that group
ends at once (the old rank 2 counts as gone), the shrink leaves rank 2 out on every
member, and the learner then takes rank 2's new process in the same way.

``mode`` (argv[1]): ``group`` sends the group, ``members`` the list of its ranks (the
newcomer then calls ``new_group`` itself: the pattern that hangs).
"""

import os
import signal
import sys
import time

import numpy as np

import minidist
from minidist.api import door

REJOIN = 11
mode = sys.argv[1] if len(sys.argv) > 1 else "group"
minidist.init(timeout=30)
rank, n = minidist.get_rank(), minidist.get_world_size()
assert n == 4, n
everyone = list(range(n))
restarted = int(os.environ.get("MINIDIST_RESTART_COUNT", "0"))


def sent_group() -> minidist.Group:
    got = minidist.recv_object(0, tag=REJOIN)
    if mode == "members":
        minidist.wait_ranks(got, timeout=5)
        return minidist.new_group(got)
    return got


own_same = None
if restarted and rank == 2:  # the member's new process: taken in at the end
    final = sent_group()
elif restarted:  # the newcomer
    new = sent_group()
    minidist.wait_ranks(list(new.ranks), timeout=5)  # it has heard of rank 2's new process
    own_same = minidist.new_group(list(new.ranks)).id == new.id
else:
    g0 = minidist.new_group(everyone)
    minidist.barrier(group=g0)
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        minidist.all_reduce(np.ones(1), group=g0)
        raise SystemExit("NO ERROR after rank 3 died")
    except minidist.PeerLostError:
        pass
    g1 = minidist.shrink_group(group=g0)
    assert list(g1.ranks) == [0, 1, 2], g1
    if rank == 0:
        assert minidist.wait_ranks([3], timeout=20) == [3]
        new = minidist.new_group(everyone)  # rank 2 is its first process here
        minidist.broadcast_object(new if mode == "group" else everyone, src=0, group=g1)
    else:
        got = minidist.broadcast_object(None, src=0, group=g1)
        new = got if mode == "group" else minidist.new_group(got)
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        minidist.barrier(group=g1)
        raise SystemExit("NO ERROR after rank 2 died")
    except minidist.PeerLostError:
        pass
    if rank == 0:
        # until the rendezvous admitted rank 2's new process (its incarnation 1)
        incarnations = door()._session.elastic.incarnations
        deadline = time.monotonic() + 20
        while incarnations[2] < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert minidist.wait_ranks([2], timeout=0) == [2], "rank 2 was not started again"
        minidist.send_object(new if mode == "group" else everyone, 3, tag=REJOIN)

if not (restarted and rank == 2):
    t = time.monotonic()
    ok = minidist.agree(True, group=new)
    took = time.monotonic() - t
    shrunk = minidist.shrink_group(group=new)
    y = np.ones(1)
    minidist.all_reduce(y, group=shrunk)
    print(f"AGREED rank={rank} ok={ok} took={took:.2f} shrunk={list(shrunk.ranks)} "
          f"sum={int(y[0])} own_same={own_same}", flush=True)
    if rank == 0:
        assert minidist.wait_ranks([2], timeout=10) == [2]
        final = minidist.new_group(everyone)
        minidist.broadcast_object(final if mode == "group" else everyone, src=0,
                                  group=shrunk)
        minidist.send_object(final if mode == "group" else everyone, 2, tag=REJOIN)
    else:
        got = minidist.broadcast_object(None, src=0, group=shrunk)
        final = got if mode == "group" else minidist.new_group(got)
ids = minidist.all_gather_object(final.id, group=final)
y = np.full(2, float(rank + 1))
minidist.all_reduce(y, group=final)
print(f"REJOINED rank={rank} restarted={restarted} same={len(set(ids)) == 1} "
      f"sum={bool(np.all(y == 10))}", flush=True)
minidist.barrier(group=final)
