"""Rooted.reused, the look a call of the rooted area takes before it overwrites what
the last call of its parity left (minidist.shm.rooted_area), against the rule stated in
the module, for every kind, root and progress of three ranks."""

from __future__ import annotations

import itertools
import types

import numpy as np

from minidist.shm.rooted_area import ALL_GATHER, GATHER, SCATTER, Rooted


def rule(me: int, done: tuple, last: tuple, kind: int, root: int) -> bool:
    """Who must have finished ``last`` before this call writes: nobody when a scatter's
    receiver follows a scatter of the same root; everyone after an all_gather, after a
    call this rank was the root of, and when this rank, a scatter's root, follows a
    scatter; else the last call's root."""
    lf, lkind, lroot = last
    if kind == SCATTER and lkind == SCATTER and lroot == root != me:
        return True
    if lkind == ALL_GATHER or lroot == me or (kind == SCATTER == lkind and me == root):
        return min(done) > lf
    return done[lroot] > lf


def test_reused_follows_the_rule_in_every_case():
    n, cases = 3, 0
    for done in itertools.product([0, 1, 2], repeat=n):
        for me in range(n):
            area = types.SimpleNamespace(me=me, size=n, dq=list(done), done=np.array(done))
            for lkind, kind in itertools.product([SCATTER, GATHER, ALL_GATHER], repeat=2):
                for lroot, root, lf in itertools.product(range(n), range(n), (0, 1)):
                    last = (lf, lkind, lroot)
                    assert Rooted.reused(area, last, kind, root) == rule(
                        me, done, last, kind, root), (me, done, last, kind, root)
                    cases += 1
    assert cases == 27 * 3 * 9 * 18


def test_reused_reads_the_done_words_of_large_groups_at_once():
    """Over 64 ranks the done words are compared by numpy (the same answer)."""
    n = 100
    done = np.full(n, 5, np.int64)
    done[77] = 3
    area = types.SimpleNamespace(me=0, size=n, dq=list(done), done=done)
    assert not Rooted.reused(area, (4, ALL_GATHER, 0), GATHER, 0)
    done[77] = 5
    assert Rooted.reused(area, (4, ALL_GATHER, 0), GATHER, 0)
