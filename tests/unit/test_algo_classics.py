"""The classic algorithms: Rabenseifner all_reduce and reduce, recursive-halving
reduce_scatter, Bruck all_gather and all_to_all, pipelined chain broadcast, double
binary tree. Every size 1..17 with every root here; sizes 18..64 sampled with
hypothesis, for these and every other built-in algorithm (the full sweep is
benchmarks/algorithms_sweep.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minidist.algorithms import COLLECTIVES, ROOTED, builtin, make_schedule, stats, verify
from minidist.algorithms.allreduce import double_trees
from minidist.algorithms.broadcast import pipeline_segments

pytestmark = pytest.mark.timeout(300)

CLASSICS = [("all_reduce", "rabenseifner"), ("all_reduce", "double_binary_tree"),
            ("reduce", "rabenseifner"), ("reduce_scatter", "recursive_halving"),
            ("all_gather", "bruck"), ("all_to_all", "bruck"), ("broadcast", "pipeline")]


@pytest.mark.parametrize(("collective", "algorithm"), CLASSICS)
def test_every_size_to_17_and_every_root(collective, algorithm):
    report = verify(collective, algorithm, range(1, 18))
    assert report.ok, str(report)


@pytest.mark.parametrize(("collective", "algorithm"), CLASSICS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(data=st.data())
def test_sampled_sizes_to_64(collective, algorithm, data):
    n = data.draw(st.integers(18, 64), label="n")
    count = data.draw(st.integers(0, 3 * n + 2), label="count")
    root = data.draw(st.integers(0, n - 1), label="root") if collective in ROOTED else 0
    report = verify(collective, algorithm, [n], counts=[count], roots=[root])
    assert report.ok, str(report)


def per_rank(collective, algorithm, n, count, key, itemsize=1):
    return [stats(make_schedule(collective, algorithm, r, n, count), itemsize)[key]
            for r in range(n)]


def test_rabenseifner_moves_what_the_ring_moves_in_log_rounds():
    for n in (2, 4, 8, 16, 32, 64):
        count = 64 * n
        L = int(math.log2(n))
        assert max(per_rank("all_reduce", "rabenseifner", n, count, "rounds")) == 2 * L
        assert per_rank("all_reduce", "rabenseifner", n, count, "elems_sent") == \
            [2 * (n - 1) * count // n] * n
        assert per_rank("all_reduce", "rabenseifner", n, count, "reduced") == \
            [(n - 1) * count // n] * n
    # other sizes fold the extra ranks in first and hand them the result last
    assert max(per_rank("all_reduce", "rabenseifner", 6, 60, "rounds")) == 2 * 2 + 2


def test_recursive_halving_reduce_scatter_rounds():
    for n in (4, 8, 16):
        assert per_rank("reduce_scatter", "recursive_halving", n, 8, "rounds") == \
            [int(math.log2(n))] * n
        assert per_rank("reduce_scatter", "recursive_halving", n, 8, "elems_sent") == \
            [(n - 1) * 8] * n


def test_bruck_needs_log_rounds_for_every_size():
    for n in range(2, 40):
        L = math.ceil(math.log2(n))
        assert per_rank("all_gather", "bruck", n, 3, "rounds") == [L] * n
        assert per_rank("all_to_all", "bruck", n, 3, "sends") == [L] * n
        assert per_rank("all_gather", "bruck", n, 3, "elems_sent") == [3 * (n - 1)] * n


def test_pipeline_rounds_and_segments():
    assert pipeline_segments(8, 4) == 4 and pipeline_segments(8, 2) == 2
    assert pipeline_segments(8, 1 << 24) == math.isqrt(7 * (1 << 24) // 16384)
    n, count = 8, 1 << 20
    segments = pipeline_segments(n, count)
    rounds = per_rank("broadcast", "pipeline", n, count, "rounds")
    assert rounds[0] == segments and max(rounds) == segments + 1
    sent = per_rank("broadcast", "pipeline", n, count, "elems_sent")
    assert sent == [count] * (n - 1) + [0]  # every rank but the last passes N on once


def test_the_two_trees_complement_each_other():
    for n in (4, 6, 8, 16, 32, 64):
        (pa, ca), (pb, cb) = double_trees(n)
        assert sum(p < 0 for p in pa) == sum(p < 0 for p in pb) == 1
        inner_a = {r for r in range(n) if ca[r]}
        inner_b = {r for r in range(n) if cb[r]}
        assert not inner_a & inner_b, n  # no rank forwards in both trees
        for parent, children in ((pa, ca), (pb, cb)):
            assert all(parent[k] == r for r in range(n) for k in children[r])
            assert all(len(k) <= 2 for k in children)
    # every rank sends about one vector in all (half in each tree), in ~2 log2 n rounds
    n, count = 16, 1600
    sent = per_rank("all_reduce", "double_binary_tree", n, count, "elems_sent")
    assert max(sent) <= 2 * count
    assert max(per_rank("all_reduce", "double_binary_tree", n, count, "rounds")) <= \
        4 * math.ceil(math.log2(n))


BUILT_IN = [(c, a) for c in COLLECTIVES for a in builtin(c)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(data=st.data())
def test_every_built_in_algorithm_sampled_to_64(data):
    collective, algorithm = data.draw(st.sampled_from(BUILT_IN), label="algorithm")
    n = data.draw(st.integers(18, 64), label="n")
    count = 0 if collective == "barrier" else data.draw(st.integers(0, 3 * n + 2),
                                                        label="count")
    root = data.draw(st.integers(0, n - 1), label="root") if collective in ROOTED else 0
    report = verify(collective, algorithm, [n], counts=[count], roots=[root])
    assert report.ok, str(report)
