"""Communicator cache keys and the store's key names."""

from __future__ import annotations

import pytest

from minidist_native._keys import ROOT, CommKey, Ordinals, group_key, host_declaration, pair_key

pytestmark = pytest.mark.timeout(30)


def test_one_communicator_per_group_and_device():
    a = group_key(0x1234, (0, 1, 2), 0)
    assert a == group_key(0x1234, [0, 1, 2], 0) and hash(a) == hash(group_key(0x1234,
                                                                           (0, 1, 2), 0))
    assert a != group_key(0x1234, (0, 1, 2), 1)          # another device
    assert a != group_key(0x9999, (0, 1, 2), 0)          # another group
    assert a != group_key(0x1234, (0, 2, 1), 0)          # another group-rank order
    cache = {a: "comm"}
    assert cache[CommKey(0x1234, (0, 1, 2), 0)] == "comm"


def test_the_device_is_not_part_of_the_store_scope():
    # members may use different device indices for one group: they must meet in the store
    assert group_key(7, (0, 1), 0).scope == group_key(7, (0, 1), 3).scope
    assert group_key(7, (0, 1), 0).scope != group_key(8, (0, 1), 0).scope


def test_pairs_are_unordered_and_distinct_from_groups():
    assert pair_key(3, 1, 0) == pair_key(1, 3, 0)
    assert pair_key(1, 3, 0).ranks == (1, 3) and pair_key(1, 3, 0).pair
    assert pair_key(1, 3, 0).scope == "p2p/1-3"
    assert pair_key(1, 3, 0) != group_key(0, (1, 3), 0)
    with pytest.raises(ValueError):
        pair_key(2, 2, 0)
    assert "pair 1<->3 on cuda:0" == str(pair_key(1, 3, 0))


def test_ordinals_give_each_setup_its_own_namespace():
    o = Ordinals()
    k = group_key(0xAB, (0, 1), 0)
    first, second = o.next(k), o.next(k)
    assert first.base == f"{ROOT}/g00000000000000ab-n2/c0"
    assert second.base.endswith("/c1")
    assert o.next(pair_key(0, 1, 0)).base == f"{ROOT}/p2p/0-1/c0"
    assert first.record(1) == first.base + "/rec/1" and first.uid == first.base + "/uid"
    every = first.every(2)
    assert first.uid in every and first.ipc(1) in every and first.done in every
    assert len(set(every)) == len(every)
    assert host_declaration(5) == f"{ROOT}/host/5"
