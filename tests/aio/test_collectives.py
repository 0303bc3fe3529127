"""Collectives with several ranks in one event loop (real sockets, one process)."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

import minidist
from minidist import algorithms, peer_memory
from minidist.ops import ReduceOp
from minidist.session import Session

from ..conftest import start_job, stop_job

REF = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum,
       ReduceOp.PRODUCT: np.multiply, ReduceOp.BXOR: np.bitwise_xor}


async def all_reduce(sessions, arrays, op=ReduceOp.SUM, algorithm=None, group=None):
    preps = [s.plan.prepare_all_reduce(a, op, group, algorithm) for s, a in zip(sessions, arrays)]
    await asyncio.gather(*(s.execute(p) for s, p in zip(sessions, preps)))


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("algorithm", algorithms.ALGORITHMS["all_reduce"])
@pytest.mark.parametrize("count", [0, 1, 7, 1000])
async def test_all_reduce_matches_numpy(n, algorithm, count):
    sessions = await start_job(n)
    try:
        rng = np.random.default_rng(count + n)
        inputs = [rng.integers(-50, 50, count).astype(np.int64) for _ in range(n)]
        arrays = [a.copy() for a in inputs]
        await all_reduce(sessions, arrays, ReduceOp.SUM, algorithm)
        expected = np.sum(inputs, axis=0) if count else np.empty(0, np.int64)
        for a in arrays:
            np.testing.assert_array_equal(a, expected)
        floats = [rng.standard_normal(count).astype(np.float32) for _ in range(n)]
        await all_reduce(sessions, floats, ReduceOp.SUM, algorithm)
        assert len({a.tobytes() for a in floats}) == 1  # bit-identical on every rank
    finally:
        await stop_job(sessions)


async def test_all_reduce_ops_and_shapes(job):
    rng = np.random.default_rng(1)
    for op, dtype in [(ReduceOp.MAX, np.float64), (ReduceOp.MIN, np.int32),
                      (ReduceOp.PRODUCT, np.int64), (ReduceOp.BXOR, np.uint16)]:
        inputs = [(rng.integers(1, 5, (3, 4)) if op == ReduceOp.PRODUCT
                   else rng.integers(0, 1000, (3, 4))).astype(dtype) for _ in job]
        arrays = [a.copy() for a in inputs]
        await all_reduce(job, arrays, op)
        want = inputs[0]
        for x in inputs[1:]:
            want = REF[op](want, x)
        for a in arrays:
            assert a.shape == (3, 4)
            np.testing.assert_array_equal(a, want)


async def test_all_reduce_avg_and_non_contiguous(job):
    base = [np.arange(20, dtype=np.float64).reshape(4, 5) * (r + 1) for r in range(len(job))]
    views = [b[:, ::2] for b in base]  # not contiguous
    expected = np.mean([v.copy() for v in views], axis=0)
    await all_reduce(job, views, ReduceOp.AVG)
    for r, (b, v) in enumerate(zip(base, views)):
        np.testing.assert_allclose(v, expected)
        # the columns outside the view are untouched
        np.testing.assert_array_equal(b[:, 1::2], np.arange(20.).reshape(4, 5)[:, 1::2] * (r + 1))


@pytest.mark.parametrize("algorithm", algorithms.ALGORITHMS["broadcast"])
async def test_broadcast_from_every_root(job, algorithm):
    for root in range(len(job)):
        arrays = [np.full(1001, r, np.float32) for r in range(len(job))]
        preps = [s.plan.prepare_broadcast(a, root, None, algorithm) for s, a in zip(job, arrays)]
        await asyncio.gather(*(s.execute(p) for s, p in zip(job, preps)))
        for a in arrays:
            assert (a == root).all()


async def test_barrier_waits_for_everyone(job):
    done = []

    async def enter(s: Session, delay: float):
        await asyncio.sleep(delay)
        await s.execute(s.plan.prepare_barrier(None))
        done.append((s.rank, asyncio.get_running_loop().time()))

    t0 = asyncio.get_running_loop().time()
    await asyncio.gather(*(enter(s, 0.3 if s.rank == 2 else 0.0) for s in job))
    assert len(done) == len(job)
    assert all(t - t0 >= 0.29 for _, t in done)


async def test_mismatched_dtype_raises_everywhere_and_leaves_arrays(job):
    arrays = [np.arange(10, dtype=np.float32 if s.rank != 1 else np.float64) for s in job]
    before = [a.copy() for a in arrays]
    preps = [s.plan.prepare_all_reduce(a, ReduceOp.SUM, None, "ring") for s, a in zip(job, arrays)]
    results = await asyncio.gather(*(s.execute(p) for s, p in zip(job, preps)),
                                   return_exceptions=True)
    for r in results:
        assert isinstance(r, minidist.CollectiveMismatchError), r
    assert "float64" in str(results[0]) or "float64" in str(results[2])
    for a, b in zip(arrays, before):
        np.testing.assert_array_equal(a, b)


async def test_mismatched_collective_kind(job):
    arrays = [np.ones(8, np.float32) for _ in job]
    preps = []
    for s, a in zip(job, arrays):
        preps.append(s.plan.prepare_broadcast(a, 0, None, None) if s.rank == 3
                     else s.plan.prepare_all_reduce(a, ReduceOp.SUM, None, None))
    results = await asyncio.gather(*(s.execute(p) for s, p in zip(job, preps)),
                                   return_exceptions=True)
    assert all(isinstance(r, minidist.CollectiveMismatchError) for r in results), results
    for a in arrays[:3]:
        assert (a == 1).all()


async def test_two_groups_concurrently_do_not_mix(job):
    ga = [s.plan.new_group([0, 1, 2, 3]) for s in job]
    gb = [s.plan.new_group([1, 3]) for s in job]
    xa = [np.full(5000, s.rank + 1, np.int64) for s in job]
    xb = [np.full(5000, 100 * (s.rank + 1), np.int64) for s in job]
    coros = []
    for s in job:
        pa = s.plan.prepare_all_reduce(xa[s.rank], ReduceOp.SUM, ga[s.rank], "ring")
        coros.append(s.execute(pa))
        if s.rank in (1, 3):
            pb = s.plan.prepare_all_reduce(xb[s.rank], ReduceOp.SUM, gb[s.rank], "ring")
            coros.append(s.execute(pb))
    await asyncio.gather(*coros)
    for s in job:
        assert (xa[s.rank] == 10).all()
    assert (xb[1] == 600).all() and (xb[3] == 600).all()
    assert (xb[0] == 100).all()


async def test_timeout_names_missing_ranks():
    sessions = await start_job(3, timeout=1.5)
    try:
        arrays = [np.ones(4) for _ in sessions]
        preps = [s.plan.prepare_all_reduce(a, ReduceOp.SUM, None, None)
                 for s, a in zip(sessions[:2], arrays)]
        results = await asyncio.gather(*(s.execute(p) for s, p in zip(sessions, preps)),
                                       return_exceptions=True)
        for r in results:
            assert isinstance(r, minidist.DistTimeoutError), r
            assert r.missing == (2,)
            assert "all_reduce" in str(r) and "[2]" in str(r)
    finally:
        await stop_job(sessions)


async def test_lost_peer_fails_every_waiting_rank():
    sessions = await start_job(4, timeout=30)
    try:
        arrays = [np.ones(100) for _ in sessions]
        preps = [s.plan.prepare_all_reduce(a, ReduceOp.SUM, None, "ring")
                 for s, a in zip(sessions[:3], arrays)]
        tasks = [asyncio.ensure_future(s.execute(p)) for s, p in zip(sessions, preps)]
        await asyncio.sleep(0.2)
        await sessions[3].close(graceful=False)  # rank 3 vanishes without a word
        t0 = asyncio.get_running_loop().time()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert asyncio.get_running_loop().time() - t0 < 5
        for r in results:
            assert isinstance(r, minidist.PeerLostError), r
            assert 3 in r.ranks
    finally:
        await stop_job(sessions[:3])


async def test_store(job):
    s0, s1 = job[0], job[1]
    got = asyncio.ensure_future(s1.client.request({"t": "kv_get", "key": "k", "timeout": 5}))
    await asyncio.sleep(0.05)
    assert not got.done()
    await s0.client.request({"t": "kv_set", "key": "k"}, b"value")
    assert (await got).blob == b"value"
    r = await s1.client.request({"t": "kv_add", "key": "n", "amount": 5})
    assert r.body["value"] == 5
    with pytest.raises(minidist.DistTimeoutError):
        await s1.client.request({"t": "kv_get", "key": "never", "timeout": 0.2})


async def test_unmatched_receive_times_out_and_names_the_sender():
    sessions = await start_job(2, timeout=0.5)
    try:
        p = sessions[0].plan.prepare_recv(np.empty(4), 1, 3, None)
        with pytest.raises(minidist.DistTimeoutError, match="from rank 1 .tag 3."):
            await sessions[0].recv(p)
        # a later matching send is not confused with the abandoned receive
        await sessions[1].send(sessions[1].plan.prepare_send(np.arange(4.0), 0, 3, None))
        buf = np.empty(4)
        await sessions[0].recv(sessions[0].plan.prepare_recv(buf, 1, 3, None))
        assert (buf == np.arange(4.0)).all()
    finally:
        await stop_job(sessions)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("count", [0, 1, 1000, 1_300_000])
async def test_shared_memory_all_reduce(n, count):
    sessions = await start_job(n, timeout=30)
    try:
        rng = np.random.default_rng(count)
        inputs = [rng.integers(-100, 100, count).astype(np.float32) for _ in range(n)]
        arrays = [a.copy() for a in inputs]
        await all_reduce(sessions, arrays, ReduceOp.SUM, "shared_memory")
        want = np.sum(np.array(inputs, np.float64), axis=0).astype(np.float32)
        for a in arrays:
            np.testing.assert_array_equal(a, want)
        # again (the segment is reused), with another op and dtype
        ints = [rng.integers(0, 1 << 20, count) for _ in range(n)]
        arrays = [a.copy() for a in ints]
        await all_reduce(sessions, arrays, ReduceOp.MAX, "shared_memory")
        for a in arrays:
            np.testing.assert_array_equal(a, np.max(ints, axis=0) if count else a)
    finally:
        await stop_job(sessions)
    assert not [f for f in os.listdir("/dev/shm") if sessions[0].job in f]


async def test_large_all_reduce_on_one_node_picks_shared_memory(job):
    mid = [np.ones(1 << 18, np.float32) for _ in job]  # 1 MiB: the fast path's mid area
    preps = [s.plan.prepare_all_reduce(a, ReduceOp.SUM, None, None) for s, a in zip(job, mid)]
    assert {p.call.algorithm_name for p in preps} == {"shared_slots"}
    assert {p.fast for p in preps} == {0}  # and the same numbers on every rank
    await asyncio.gather(*(s.execute(p) for s, p in zip(job, preps)))
    assert all((a == len(job)).all() for a in mid)
    # 20 MiB: every rank reads the others' vectors where they can (here: one process),
    # else the segment's schedule
    arrays = [np.ones(5 << 20, np.float32) for _ in job]
    preps = [s.plan.prepare_all_reduce(a, ReduceOp.SUM, None, None) for s, a in zip(job, arrays)]
    want = "single_copy" if peer_memory.key() is not None else "shared_memory"
    assert {p.call.algorithm_name for p in preps} == {want}
    await asyncio.gather(*(s.execute(p) for s, p in zip(job, preps)))
    assert all((a == len(job)).all() for a in arrays)


async def test_gather_and_scatter_agree_on_the_algorithm_at_every_size(job):
    # the root holds the whole buffer, the others one block: all must plan alike
    n = len(job)
    for count in (1, 64 * 1024, 200_000):
        xs = [np.full(count, s.rank, np.float32) for s in job]
        outs = [np.empty(count * n, np.float32) if s.rank == 0 else None for s in job]
        preps = [s.plan.prepare_gather(x, o, 0, None, None) for s, x, o in zip(job, xs, outs)]
        assert len({p.call.algorithm_name for p in preps}) == 1
        await asyncio.gather(*(s.execute(p) for s, p in zip(job, preps)))
        np.testing.assert_array_equal(outs[0], np.repeat(np.arange(n, dtype=np.float32), count))
        ys = [np.empty(count, np.float32) for _ in job]
        preps = [s.plan.prepare_scatter(y, outs[0] if s.rank == 0 else None, 0, None, None)
                 for s, y in zip(job, ys)]
        assert len({p.call.algorithm_name for p in preps}) == 1
        await asyncio.gather(*(s.execute(p) for s, p in zip(job, preps)))
        for r, y in enumerate(ys):
            assert (y == r).all()


async def test_shared_memory_refused_where_it_cannot_work(job, monkeypatch):
    job[0].plan.shm_enabled = False
    with pytest.raises(ValueError, match="shared_memory"):
        job[0].plan.prepare_all_reduce(np.ones(4), ReduceOp.SUM, None, "shared_memory")


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("fast", [True, False])
async def test_large_broadcast_goes_through_shared_memory(n, fast):
    """Through the fast path's mid area (several steps), or with the fast path off
    through the segment's shared_memory schedule."""
    sessions = await start_job(n, timeout=30)
    try:
        count = 3_000_000 if fast else 2_100_000  # fast: several steps
        for s in sessions:
            s.plan.fast = s.plan.fast and fast
        want = "shared_slots" if sessions[0].plan.fast else "shared_memory"
        for root in (0, n - 1):
            arrays = [np.full(count, s.rank, np.float32) for s in sessions]
            preps = [s.plan.prepare_broadcast(a, root, None, None)
                     for s, a in zip(sessions, arrays)]
            assert {p.call.algorithm_name for p in preps} == {want}
            await asyncio.gather(*(s.execute(p) for s, p in zip(sessions, preps)))
            assert all((a == root).all() for a in arrays)
    finally:
        await stop_job(sessions)


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "tree"])
async def test_large_messages(algorithm):
    n = 3
    sessions = await start_job(n, timeout=60)
    try:
        count = 1_500_007  # 6 MB of float32
        rng = np.random.default_rng(5)
        inputs = [rng.integers(-9, 9, count).astype(np.float32) for _ in range(n)]
        arrays = [a.copy() for a in inputs]
        await all_reduce(sessions, arrays, ReduceOp.SUM, algorithm)
        want = np.sum(inputs, axis=0)
        for a in arrays:
            np.testing.assert_array_equal(a, want)
        assert len({a.tobytes() for a in arrays}) == 1
        outs = [np.empty(count * n, np.float32) for _ in sessions]
        preps = [s.plan.prepare_all_gather(o, x, None, "ring")
                 for s, o, x in zip(sessions, outs, inputs)]
        await asyncio.gather(*(s.execute(p) for s, p in zip(sessions, preps)))
        for o in outs:
            np.testing.assert_array_equal(o, np.concatenate(inputs))
    finally:
        await stop_job(sessions)
