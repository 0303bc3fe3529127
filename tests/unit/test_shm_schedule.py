"""The shared-memory all_reduce schedule in the simulator, with chunks small enough to
exercise both banks and every overlap of copy in, reduce and copy out."""

import itertools

import numpy as np
import pytest

from minidist.algorithms import shm, simulator
from minidist.ops import ReduceOp


@pytest.mark.parametrize("n, count, chunk", list(itertools.product(
    [1, 2, 3, 5, 8, 9], [0, 1, 7, 100, 1001], [1, 3, 64])))
def test_shared_memory_matches_numpy(n, count, chunk):
    scheds = [shm.shared_memory(r, n, count, chunk) for r in range(n)]
    assert all(s.shared_tmp for s in scheds)
    rng = np.random.default_rng(n * 1000 + count)
    inputs = [rng.integers(-50, 50, count).astype(np.int64) for _ in range(n)]
    tmp = np.full(scheds[0].tmp_size, -(1 << 40), np.int64)  # poison
    bufs = [{"out": x.copy(), "in": np.empty(0, np.int64), "tmp": tmp} for x in inputs]
    simulator.run(scheds, bufs, ReduceOp.SUM, rendezvous=True)
    want = np.sum(inputs, axis=0) if count else np.empty(0, np.int64)
    for b in bufs:
        np.testing.assert_array_equal(b["out"], want)
    simulator.check_out_contract(scheds)


def test_float_results_are_bit_identical():
    n, count = 5, 999
    scheds = [shm.shared_memory(r, n, count, 50) for r in range(n)]
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(count).astype(np.float32) for _ in range(n)]
    tmp = np.zeros(scheds[0].tmp_size, np.float32)
    bufs = [{"out": x.copy(), "in": np.empty(0, np.float32), "tmp": tmp} for x in inputs]
    simulator.run(scheds, bufs, ReduceOp.SUM)
    assert len({b["out"].tobytes() for b in bufs}) == 1


def test_chunk_size_keeps_the_segment_bounded():
    for n in (2, 8, 64, 1024):
        chunk = shm.chunk_elements(n, 4)
        assert shm.layout(n, chunk)[1] * 4 <= shm.SEGMENT_BYTES


@pytest.mark.parametrize("n, count, chunk", list(itertools.product(
    [1, 2, 3, 5, 8], [0, 1, 7, 100], [1, 3, 64])))
def test_shared_memory_broadcast_from_every_root(n, count, chunk):
    for root in range(n):
        scheds = [shm.broadcast_shared_memory(r, n, count, root, chunk) for r in range(n)]
        tmp = np.full(scheds[0].tmp_size, -1, np.int64)
        inputs = [np.arange(count, dtype=np.int64) * 10 + r for r in range(n)]
        bufs = [{"out": x.copy(), "in": np.empty(0, np.int64), "tmp": tmp} for x in inputs]
        simulator.run(scheds, bufs, ReduceOp.SUM, rendezvous=True)
        for b in bufs:
            np.testing.assert_array_equal(b["out"], inputs[root])
