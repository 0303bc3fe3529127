"""Small blocking sends on an open connection go out from the caller's thread: they
complete while this rank's event loop is held up, and arrive intact and in order (the
first few through the receiver's inbox, the rest, once its ring is full, through the
socket)."""

import threading

import numpy as np

import minidist
from minidist import api

minidist.init()
rank = minidist.get_rank()
if rank == 0:
    # too large for the inbox and for the stash: opens the connection
    minidist.send(np.arange(2_100_000.0), 1)
    minidist.send_object({"hello": 1}, 1)
    # the receiver has read them: the socket has room again (a busy machine could leave
    # the large message's tail in it, and a send that finds no room rightly waits)
    assert minidist.recv_object(1, tag=6) == "read"
    released = threading.Event()
    outcome = []
    # hold the loop thread until the sends below have returned (or 20 s pass)
    api.door().runtime.loop.call_soon_threadsafe(lambda: outcome.append(released.wait(20)))
    for i in range(50):
        minidist.send(np.full(8, float(i)), 1, tag=7)
    minidist.send_object(("done", list(range(100))), 1, tag=8)
    released.set()
    minidist.barrier()
    assert outcome == [True], "a small blocking send waited for the event loop"
    print("DIRECT SENDS OK", flush=True)
else:
    a = np.zeros(2_100_000)
    minidist.recv(a, 0)
    assert (a == np.arange(2_100_000.0)).all()
    assert minidist.recv_object(0) == {"hello": 1}
    minidist.send_object("read", 0, tag=6)
    for i in range(50):
        b = np.zeros(8)
        minidist.recv(b, 0, tag=7)
        assert (b == i).all(), (i, b)
    assert minidist.recv_object(0, tag=8) == ("done", list(range(100)))
    minidist.barrier()
minidist.destroy()
