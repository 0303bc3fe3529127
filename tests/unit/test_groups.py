"""Group membership checks and node layouts, without sockets."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.group import NON_GROUP_MEMBER
from minidist.plan import Planner, _members


def _session(rank: int, nodes: list[int]) -> Planner:
    """The pure planning layer of one rank: no socket, no loop."""
    s = Planner(rank, len(nodes), lambda g: 0, lambda g, p, t, sending: 0, False, None, {})
    s.set_nodes(nodes)
    return s


def test_members_sorted_and_checked():
    assert _members(None, 4) == (0, 1, 2, 3)
    assert _members([3, 1, np.int64(2)], 4) == (1, 2, 3)
    assert _members(range(2, 4), 4) == (2, 3)
    assert _members([], 4) == ()
    with pytest.raises(ValueError, match="outside 0..3"):
        _members([0, 4], 4)
    with pytest.raises(ValueError, match="outside 0..3"):
        _members([-1, 2], 4)
    with pytest.raises(ValueError, match="duplicate ranks.*rank 2"):
        _members([2, 0, 2], 4)
    for bad in ([True, False], [1.0, 2.0], ["1"], [[0, 1]]):
        with pytest.raises(ValueError, match="not an integer rank"):
            _members(bad, 4)


def test_new_group_ids_follow_members_and_order():
    a, b = _session(0, [0] * 6), _session(5, [0] * 6)
    # rank 5 never creates the first group (it is not in it): ids still agree
    ga1 = a.new_group([0, 1, 2])
    ga2, gb2 = a.new_group([5, 0]), b.new_group([0, 5])
    assert gb2.id == ga2.id != ga1.id and gb2.ranks == (0, 5)
    assert b.new_group([1, 2]) is NON_GROUP_MEMBER
    # the second group with the same members is a different group
    assert a.new_group([0, 5]).id == b.new_group([0, 5]).id != ga2.id
    before = dict(a._group_counts)
    with pytest.raises(ValueError):
        a.new_group([0, 6])
    assert a._group_counts == before  # a refused group is not counted


def _appearance(nodes: list[int]) -> tuple[int, ...]:
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(n, len(seen)) for n in nodes)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=2, max_size=40), st.data())
def test_layout_numbers_nodes_in_order_of_appearance(nodes, data):
    s = _session(0, nodes)
    ranks = data.draw(st.lists(st.integers(0, len(nodes) - 1), min_size=1, unique=True))
    if 0 not in ranks:
        ranks.append(0)
    g = s.new_group(ranks)
    assert s.placement.layout(g) == _appearance([nodes[r] for r in g.ranks])
