"""A schedule whose operations grow with the group past SCHEDULE_KEEP_OPS (a ring or a
pairwise exchange over about 700 ranks and more) is built for each call and not kept,
neither in make_schedule's cache nor in a rank's plans: after such a call a rank holds
nothing that grows with the group. Smaller schedules are kept, and a repeated call gets
the same object."""

from __future__ import annotations

import numpy as np
import pytest

from minidist.algorithms import SCHEDULE_KEEP_OPS, cost, make_schedule
from minidist.ops import ReduceOp
from minidist.plan import Planner

pytestmark = pytest.mark.timeout(120)

BIG = SCHEDULE_KEEP_OPS // 2 + 8  # pairwise all_to_all: 2 (n - 1) + 1 operations


def test_operations_counts_messages_and_local_operations() -> None:
    s = make_schedule("all_to_all", "pairwise", 3, 8, 4, keep=False)
    assert s.operations == 2 * 7 + 1  # a send and a receive per step, one own copy
    assert make_schedule("barrier", "tree", 0, 1, 0, keep=False).operations == 0


def test_a_large_schedule_is_built_again_and_not_kept() -> None:
    make_schedule.cache_clear()
    big = make_schedule("all_to_all", "pairwise", 5, BIG, 2)
    assert big.operations > SCHEDULE_KEEP_OPS
    assert make_schedule.cache_info().currsize == 0
    again = make_schedule("all_to_all", "pairwise", 5, BIG, 2)
    assert again == big and again is not big
    small = make_schedule("all_to_all", "pairwise", 5, 16, 2)
    assert small.operations <= SCHEDULE_KEEP_OPS
    assert make_schedule("all_to_all", "pairwise", 5, 16, 2) is small
    assert make_schedule.cache_info().currsize == 1


def test_the_cache_keeps_the_last_ones_used() -> None:
    make_schedule.cache_clear()
    info = make_schedule.cache_info()
    first = make_schedule("all_reduce", "ring", 0, 4, 10)
    for count in range(1, info.maxsize + 1):  # fills it: the first is the oldest
        make_schedule("all_reduce", "ring", 1, 4, count)
    assert make_schedule.cache_info().currsize == info.maxsize
    assert make_schedule("all_reduce", "ring", 0, 4, 10) is not first
    make_schedule.cache_clear()
    assert make_schedule.cache_info() == (0, 0, info.maxsize, 0)


def test_a_rank_keeps_the_plan_of_a_small_call_and_not_of_a_large_one() -> None:
    def plans(n: int, count: int) -> tuple[Planner, object, object]:
        p = Planner(1, n, lambda g: 0, lambda g, q, t, s: 0, False, cost.DEFAULT, {})
        out, inp = np.zeros(n * count, np.float32), np.ones(n * count, np.float32)
        a = p.prepare_all_to_all(out, inp, None, "pairwise")
        b = p.prepare_all_to_all(out, inp, None, "pairwise")
        return p, a, b

    p, a, b = plans(16, 2)
    assert len(p._plans) == 1 and b.schedule is a.schedule
    p, a, b = plans(BIG, 2)
    assert a.schedule.operations > SCHEDULE_KEEP_OPS
    assert len(p._plans) == 0 and b.schedule == a.schedule
    assert b.call.algorithm == a.call.algorithm  # planned again, the same way
    # a reduction over the same group keeps its (small) plan
    p.prepare_all_reduce(np.zeros(8, np.float32), ReduceOp.SUM, None, "recursive_doubling")
    assert len(p._plans) == 1
