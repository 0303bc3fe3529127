"""Messages on one node through the inboxes and the sockets, mixed every way a receive
can take them; every byte is checked. Run by test_failures with 3 ranks and a seed."""

import sys

import numpy as np

import minidist
from minidist import CollectiveMismatchError
from minidist.api import door

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
rng = np.random.default_rng(seed)  # the same plan on every rank
DTYPES = [np.float32, np.int64, np.uint8, np.float64]


def data(k: int, nbytes: int, dtype) -> np.ndarray:
    count = max(1, nbytes // np.dtype(dtype).itemsize)
    return (np.arange(count) * 7 + k * 13 + rank * 1000).astype(dtype)


def expect(k: int, nbytes: int, dtype, src: int) -> np.ndarray:
    count = max(1, nbytes // np.dtype(dtype).itemsize)
    return (np.arange(count) * 7 + k * 13 + src * 1000).astype(dtype)


# A: ping-pong 0 <-> 1, sizes on both sides of the inbox's limit, of the stash's (16 MiB)
sizes = rng.choice([1, 8, 1024, 4096, 65536, 65537, 80000, 1 << 20, 3_000_001], 600)
sizes[rng.integers(0, 600, 3)] = (16 << 20) + 8  # too large for the stash: the socket
kinds = rng.integers(0, len(DTYPES), 600)
for k, (nb, kd) in enumerate(zip(sizes, kinds)):
    dt = DTYPES[kd]
    if rank == 0:
        minidist.send(data(k, nb, dt), 1, tag=1)
        buf = np.empty_like(expect(k, nb, dt, 1))
        assert minidist.recv(buf, 1, tag=1) == 1
        assert (buf == expect(k, nb, dt, 1)).all(), ("A", k)
    elif rank == 1:
        buf = np.empty_like(expect(k, nb, dt, 0))
        minidist.recv(buf, 0, tag=1)
        assert (buf == expect(k, nb, dt, 0)).all(), ("A", k)
        minidist.send(data(k, nb, dt), 0, tag=1)

# B: ten messages with ten tags, received in a shuffled order (the ring fills); every
# other round large ones, which wait in the sender's stash (some of them moved to the
# mailbox by the receive that looks for another tag)
for rnd in range(20):
    order = rng.permutation(10)
    nb = 64 if rnd % 2 else 300_000
    if rank == 1:
        for t in range(10):
            minidist.send(data(rnd * 10 + t, nb, np.int64), 0, tag=100 + t)
    elif rank == 0:
        for t in order:
            buf = np.empty(nb // 8, np.int64)
            minidist.recv(buf, 1, tag=100 + int(t))
            assert (buf == expect(rnd * 10 + int(t), nb, np.int64, 1)).all(), ("B", rnd, t)
    minidist.barrier()

# C: one tag, taken by every kind of receive in turn (blocking, async, any source,
# probe, object), messages of one sender in order
for rnd in range(20):
    if rank == 2:
        for k in range(6):
            minidist.send(data(rnd * 6 + k, 32, np.float32), 0, tag=7)
        minidist.send_object(("obj", rnd), 0, tag=8)
    elif rank == 0:
        got = []
        buf = np.empty(8, np.float32)
        minidist.recv(buf, 2, tag=7)
        got.append(buf.copy())
        w = minidist.irecv(buf2 := np.empty(8, np.float32), 2, tag=7)
        w.wait()
        got.append(buf2.copy())
        minidist.recv(buf, 2, tag=7)
        got.append(buf.copy())
        assert minidist.recv(buf, None, tag=7) == 2
        got.append(buf.copy())
        assert minidist.probe(2, tag=7) == 2
        minidist.recv(buf, 2, tag=7)
        got.append(buf.copy())
        assert minidist.recv_object(2, tag=8) == ("obj", rnd)
        minidist.recv(buf, 2, tag=7)
        got.append(buf.copy())
        for k in range(6):
            assert (got[k] == expect(rnd * 6 + k, 32, np.float32, 2)).all(), ("C", rnd, k)
    minidist.barrier()

# D: two senders to one receiver, taken in the other order; objects of both sizes
for rnd in range(30):
    if rank in (1, 2):
        minidist.send(data(rnd, 48, np.int64), 0, tag=9)
        minidist.send_object({"r": rank, "pad": "x" * (rnd * 5347 % 140000)}, 0, tag=10)
    else:
        for src in (2, 1) if rnd % 2 else (1, 2):
            buf = np.empty(6, np.int64)
            minidist.recv(buf, src, tag=9)
            assert (buf == expect(rnd, 48, np.int64, src)).all(), ("D", rnd, src)
            want = {"r": src, "pad": "x" * (rnd * 5347 % 140000)}
            assert minidist.recv_object(src, tag=10) == want

# E: a message that does not fit fails its receive and leaves the buffer alone; the
# next message is received as usual. F: a strided receive buffer.
if rank == 1:
    minidist.send(np.arange(4, dtype=np.float32), 0, tag=11)
    minidist.send(np.arange(4, dtype=np.int32), 0, tag=11)
    minidist.send(np.arange(6, dtype=np.float64), 0, tag=12)
elif rank == 0:
    buf = np.full(4, -1, np.int32)
    try:
        minidist.recv(buf, 1, tag=11)
        raise AssertionError("a float32 message was received into an int32 buffer")
    except CollectiveMismatchError:
        assert (buf == -1).all()
    minidist.recv(buf, 1, tag=11)
    assert (buf == np.arange(4)).all()
    big = np.zeros(12, np.float64)
    minidist.recv(big[::2], 1, tag=12)
    assert (big[::2] == np.arange(6)).all() and (big[1::2] == 0).all()

p2p = door()._session.p2p
counts = np.array([p2p.sent, p2p.received, p2p.stashed], np.int64)
minidist.all_reduce(counts)
assert counts.all(), counts  # the inboxes and the stashes carried messages
minidist.barrier()
if rank == 0:
    print(f"FAST P2P OK {counts[0]} {counts[1]}", flush=True)
minidist.destroy()
