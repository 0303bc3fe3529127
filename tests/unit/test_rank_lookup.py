"""A group's and an inbox's rank lookups answer as a table of their ranks would, whether
the ranks are a run of consecutive ranks (found by arithmetic, no per-member table) or
not."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from minidist.group import Group
from minidist.placement import Placement
from minidist.shm.ring_index import RingIndex, node_ranks

runs = st.builds(lambda lo, n: tuple(range(lo, lo + n)), st.integers(0, 50), st.integers(0, 40))
scattered = st.lists(st.integers(0, 90), unique=True, max_size=40).map(tuple)
probes = st.lists(st.integers(-5, 100), max_size=30)


@given(ranks=st.one_of(runs, scattered), probe=probes)
def test_group_rank_of_is_the_index_of_the_rank(ranks, probe):
    g = Group(7, ranks)
    table = {r: i for i, r in enumerate(ranks)}
    for r in [*probe, *ranks]:
        assert g.rank_of(r) == table.get(r, -1)
        assert g.rank_of(np.int64(r)) == table.get(r, -1)
        assert (r in g) == (r in table)


def test_group_rank_of_other_keys_and_replace():
    g = Group(1, (0, 1, 2, 3))
    assert g.rank_of(2.0) == 2 and g.rank_of("2") == -1 and g.rank_of(None) == -1
    h = dataclasses.replace(g, ranks=(9, 4))  # a new group: its own lookup
    assert (h.rank_of(9), h.rank_of(4), h.rank_of(0)) == (0, 1, -1)
    assert (g.rank_of(0), g.rank_of(9)) == (0, -1)


def test_world_group_holds_no_table_per_member():
    ranks = tuple(range(4096))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        g = Group(0, ranks)
        assert g.rank_of(4095) == 4095 and g.rank_of(4096) == -1
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 4096, held  # a table would take over 100 KiB


@given(nodes=st.lists(st.integers(0, 3), min_size=1, max_size=40), data=st.data())
def test_ring_index_answers_as_a_dict(nodes, data):
    rank = data.draw(st.integers(0, len(nodes) - 1))
    local = node_ranks(nodes, rank)
    assert list(local) == [r for r in range(len(nodes)) if nodes[r] == nodes[rank]]
    rings = RingIndex(local)
    table = {r: i for i, r in enumerate(local)}
    gone = data.draw(st.lists(st.sampled_from(list(local)), max_size=3))
    for r in gone:
        assert rings.pop(r) == table.pop(r, None)
    assert rings.pop(-1, "absent") == "absent"
    for r in [*range(-2, len(nodes) + 2), *gone]:
        assert rings.get(r) == table.get(r)
        assert (r in rings) == (r in table)
        if r in table:
            assert rings[r] == table[r]
    assert rings.get("x") is None


def test_one_node_ranks_are_a_range():
    assert node_ranks([0] * 1024, 5) == range(1024)
    assert node_ranks([0, 0, 1, 1, 0], 1) == (0, 1, 4)


def test_placement_keeps_one_string_per_distinct_read_key():
    keys = [str(i // 500) + "-key-of-a-pid-namespace" for i in range(1000)]
    keys = [k.encode().decode() for k in keys]  # distinct objects, as JSON gives them
    p = Placement(1000)
    p.set([0] * 1000, keys)
    assert len({id(k) for k in p._read_keys}) == 2
    assert p._read_keys == keys


@given(ranks=st.one_of(runs, scattered), others=st.sets(st.integers(-5, 100), max_size=10))
def test_members_among_is_the_members_in_group_order(ranks, others):
    g = Group(3, ranks)
    assert g.members_among(others) == [r for r in ranks if r in others]
    assert g.members_among(dict.fromkeys(others, "why")) == [r for r in ranks if r in others]


def test_choosing_by_replay_keeps_no_other_ranks_schedules():
    from minidist.algorithms import cost, make_schedule, schedules

    make_schedule.cache_clear()
    cost._replayed_call.cache_clear()
    cost._replayed.cache_clear()
    cost.choose_replayed("all_to_all", 16, 64)  # replays every rank's schedules
    cost.choose_replayed("all_to_all", 128, 1024)  # the closed form, after a count
    cost.estimate("ring", 8, 1 << 20)
    assert make_schedule.cache_info().currsize == 0
    built = schedules("all_to_all", "bruck", 4, 8)
    assert make_schedule.cache_info().currsize == 0
    kept = make_schedule("all_to_all", "bruck", 2, 4, 8)
    assert make_schedule.cache_info().currsize == 1 and built[2] == kept
    assert make_schedule("all_to_all", "bruck", 2, 4, 8, keep=False) == kept
    assert make_schedule.cache_info().currsize == 1
