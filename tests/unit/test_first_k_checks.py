"""What recv_many and the rooted fast calls accept, checked without processes."""

from __future__ import annotations

import numpy as np
import pytest

from minidist.plan import Planner
from minidist.shm import fast_slots, first_k, rooted_area


def planner(rank: int = 0, n: int = 4) -> Planner:
    return Planner(rank, n, lambda g: 0, lambda g, p, t, s: 0, False, None, {})


def test_recv_many_takes_any_other_rank_one_or_a_set():
    m = first_k.prepare(planner(), np.zeros((3, 5), np.float32), None, 7, None)
    assert m.ranks == (1, 2, 3) and len(m.items) == 3 and m.tag == 7
    assert all(p.flat.shape == (5,) and p.flat.dtype == np.float32 for p in m.items)
    assert first_k.prepare(planner(), np.zeros((1, 2)), 2, 0, None).ranks == (2,)
    assert first_k.prepare(planner(), np.zeros((2, 2)), [3, 1], 0, None).ranks == (3, 1)


def test_recv_many_rows_that_are_not_contiguous_are_copied_back():
    out = np.zeros((2, 6))[:, ::2]
    m = first_k.prepare(planner(), out, None, 0, None)
    assert all(p.user is not None and p.flat.flags.c_contiguous for p in m.items)


@pytest.mark.parametrize("output,src,err", [
    (np.zeros((0, 3)), None, ValueError),  # no message
    (np.zeros(()), None, ValueError),  # no first axis
    ([[1, 2]], None, TypeError),  # not an array
    (np.zeros((2, 2)), 0, ValueError),  # this rank itself
    (np.zeros((2, 2)), 9, ValueError),  # not a member
    (np.zeros((2, 2)), [1, 1], ValueError),  # twice
    (np.zeros((2, 2)), [], ValueError),  # nobody
])
def test_recv_many_refuses_bad_arguments(output, src, err):
    with pytest.raises(err):
        first_k.prepare(planner(), output, src, 0, None)


def test_rooted_calls_fit_up_to_1024_ranks_and_a_piece_each():
    assert rooted_area.piece_bytes(9) == 32 << 10  # a stack of 84 x 84 frames fits
    assert rooted_area.piece_bytes(129) == 32 << 10
    assert rooted_area.piece_bytes(1024) == 4608
    assert rooted_area.takes("scatter", 9, 28 << 10)
    assert rooted_area.takes("gather", 1024, 4608)
    assert not rooted_area.takes("gather", 1024, 4609)
    assert not rooted_area.takes("scatter", 1025, 8)
    assert not rooted_area.takes("all_to_all", 9, 8)
    for n in (2, 9, 64, 65, 129, 1024):  # the area lies between the slots and the mid area
        assert rooted_area.area_at(n) >= n * 2 * fast_slots.SLOT
        assert rooted_area.area_at(n) + rooted_area.area_bytes(n) <= fast_slots.segment_bytes(n)
        assert rooted_area.area_bytes(n) <= 10 << 20
