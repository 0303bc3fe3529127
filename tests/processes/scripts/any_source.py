"""Rank 0 collects one array from each of the other ranks with recv(src=None), in the
order they arrive and with the right senders; then objects, probes and the async forms."""

import time

import numpy as np

import minidist

minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
if rank == 0:
    minidist.barrier()
    got = []
    for _ in range(n - 1):
        buf = np.zeros(4, np.int64)
        src = minidist.recv(buf, src=None, tag=5)
        assert (buf == src).all(), (src, buf)
        got.append(src)
    assert sorted(got) == list(range(1, n)), got
    # workers sent in a staggered order: arrival order is what recv returns
    assert got == sorted(got, key=lambda r: (r * 7) % n), got
    # several messages per sender keep their order per sender
    seen = {r: [] for r in range(1, n)}
    for _ in range(3 * (n - 1)):
        obj, src = minidist.recv_object(src=None, tag=6, return_source=True)
        seen[src].append(obj)
    assert all(seen[r] == [(r, k) for k in range(3)] for r in seen), seen
    # probe, then the receive takes exactly the probed message
    src = minidist.probe(src=None, tag=7)
    assert minidist.recv_object(src, tag=7) == src
    w = minidist.irecv_object(src=None, tag=8)
    assert w.result() == "late" and w.source_rank() == n - 1
    assert minidist.iprobe(src=None, tag=9) is None  # nothing was sent with tag 9
    minidist.barrier()
    print("ANY SOURCE OK", flush=True)
else:
    minidist.barrier()
    time.sleep(0.1 * ((rank * 7) % n))  # a known arrival order
    minidist.send(np.full(4, rank, np.int64), 0, tag=5)
    for k in range(3):
        minidist.send_object((rank, k), 0, tag=6)
    if rank == 1:
        minidist.send_object(1, 0, tag=7)
    if rank == n - 1:
        time.sleep(0.2)
        minidist.isend_object("late", 0, tag=8).wait()
    minidist.barrier()
