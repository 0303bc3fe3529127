"""A receiver that makes its inbox after its peer's first send (a rank makes it at its
first blocking receive from a rank of its node): the sender's next sends, 10 ms later,
go through the inbox's ring. Prints "INBOX LATE OK <ring sends of 20>" on rank 1."""

import time

import numpy as np

import minidist
from minidist.process_state import STATE

minidist.init(timeout=30)
rank = minidist.get_rank()
x = np.zeros(4, np.int64)
p2p = STATE.blocking._session.p2p
if rank == 1:
    minidist.send(np.full(4, -1, np.int64), 0)  # rank 0 has no inbox yet
    minidist.recv(x, 0)
    time.sleep(0.01)  # rank 0 waits in its first blocking receive: its inbox is made
    before = p2p.sent
    for i in range(20):  # one at a time (a full ring sends the rest by socket)
        minidist.send(np.full(4, i, np.int64), 0)
        minidist.recv(x, 0)
    print(f"INBOX LATE OK {p2p.sent - before}", flush=True)
else:
    minidist.irecv(x, 1).wait()  # on the loop: no inbox made
    assert (x == -1).all(), x
    minidist.send(x, 1)
    for i in range(20):
        minidist.recv(x, 1)
        assert (x == i).all(), (i, x)
        minidist.send(x, 1)
minidist.destroy()
