"""Every collective, point-to-point and object call of the numpy API against numpy."""

import numpy as np

import minidist
from minidist import ReduceOp

minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
rng = np.random.default_rng(7)


def inputs(count, dtype=np.int64):
    return [np.arange(count, dtype=dtype) * (r + 1) + r for r in range(n)]


for count in (0, 1, 5, 1000, 70_000):
    xs = inputs(count)
    # reduce to every root; non-roots keep their arrays
    for dst in range(n):
        x = xs[rank].copy()
        minidist.reduce(x, dst=dst, op=ReduceOp.SUM)
        np.testing.assert_array_equal(x, np.sum(xs, axis=0) if rank == dst else xs[rank])
    # all_gather
    out = np.empty(count * n, np.int64)
    minidist.all_gather(out, xs[rank])
    np.testing.assert_array_equal(out, np.concatenate(xs))
    # reduce_scatter
    big = inputs(count * n)
    out = np.empty(count, np.int64)
    minidist.reduce_scatter(out, big[rank], op=ReduceOp.MAX)
    np.testing.assert_array_equal(out, np.max(big, axis=0)[rank * count:(rank + 1) * count])
    # gather / scatter
    for root in (0, n - 1):
        out = np.empty(count * n, np.int64) if rank == root else None
        minidist.gather(xs[rank], out, dst=root)
        if rank == root:
            np.testing.assert_array_equal(out, np.concatenate(xs))
        out = np.empty(count, np.int64)
        minidist.scatter(out, big[root] if rank == root else None, src=root)
        np.testing.assert_array_equal(out, big[root][rank * count:(rank + 1) * count])
    # all_to_all
    out = np.empty(count * n, np.int64)
    minidist.all_to_all(out, big[rank])
    want = np.concatenate([big[j][rank * count:(rank + 1) * count] for j in range(n)])
    np.testing.assert_array_equal(out, want)

# point-to-point: a ring, tags keep separate streams, order is kept per tag
right, left = (rank + 1) % n, (rank - 1) % n
if n > 1:
    works = [minidist.isend(np.full(3, rank * 10 + i, np.float32), right, tag=i % 2)
             for i in range(4)]
    got = []
    for i in (1, 0, 3, 2):  # receive tag 1 before tag 0: tags are separate streams
        buf = np.empty(3, np.float32)
        minidist.recv(buf, left, tag=i % 2)
        got.append(buf[0])
    for w in works:
        w.wait()
    assert got == [left * 10 + 1, left * 10 + 0, left * 10 + 3, left * 10 + 2], got
    # a buffer that does not fit: a clear error and the buffer untouched
    minidist.send(np.ones((2, 3), np.float32), right, tag=5)
    wrong = np.full((3, 2), -1.0, np.float32)
    try:
        minidist.recv(wrong, left, tag=5)
    except minidist.CollectiveMismatchError as e:
        assert "unchanged" in str(e)
        assert (wrong == -1).all()
    else:
        raise AssertionError("a (2, 3) message fit a (3, 2) buffer")
    # objects
    minidist.send_object({"from": rank, "obs": [rank] * 3}, right, tag=9)
    assert minidist.recv_object(left, tag=9) == {"from": left, "obs": [left] * 3}

assert minidist.broadcast_object({"cfg": rank}, src=n - 1) == {"cfg": n - 1}
assert minidist.all_gather_object(("r", rank, "x" * rank)) == [("r", r, "x" * r) for r in range(n)]
g = minidist.gather_object(rank * 2, dst=0)
assert g == ([r * 2 for r in range(n)] if rank == 0 else None), g
assert minidist.scatter_object([f"to{r}" for r in range(n)] if rank == 1 % n else None,
                               src=1 % n) == f"to{rank}"
minidist.barrier()
if rank == 0:
    print("ALL COLLECTIVES OK", flush=True)
minidist.destroy()
