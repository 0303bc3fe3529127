"""The socket path's scratch arrays: small ones kept for the next call, large ones not."""

import numpy as np

from minidist.scratch import KEPT, KEPT_BYTES, ScratchPool


def test_small_arrays_come_back_and_large_ones_are_let_go():
    pool = ScratchPool()
    f4 = np.dtype(np.float32)
    small = pool.take(f4, 100)
    pool.give(small)
    assert pool.take(f4, 100) is small
    big = pool.take(f4, KEPT_BYTES // 4 + 1)
    pool.give(big)
    assert pool.take(f4, KEPT_BYTES // 4 + 1) is not big
    edge = pool.take(f4, KEPT_BYTES // 4)
    pool.give(edge)
    assert pool.take(f4, KEPT_BYTES // 4) is edge


def test_at_most_kept_arrays_of_a_kind():
    pool = ScratchPool()
    i8 = np.dtype(np.int64)
    arrays = [pool.take(i8, 10) for _ in range(KEPT + 2)]
    for a in arrays:
        pool.give(a)
    back = [pool.take(i8, 10) for _ in range(KEPT + 2)]
    assert sum(any(b is a for a in arrays) for b in back) == KEPT
