"""Doorbells sent on the loop (minidist.shm.p2p): tracked until done, and none left
running when the rank leaves."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from minidist.shm.p2p import Doorbells

pytestmark = pytest.mark.timeout(30)


def _p2p(send_p2p) -> Doorbells:
    return Doorbells(SimpleNamespace(send_p2p=send_p2p))


def test_a_doorbell_stuck_on_its_way_is_cancelled_when_the_rank_leaves():
    ended = []

    async def forever(bell, timeout):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    async def main():
        p = _p2p(forever)
        p.send_on_loop(object(), 1.0)
        await asyncio.sleep(0)
        assert len(p.pending) == 1
        start = asyncio.get_running_loop().time()
        await p.end(0.05)
        assert asyncio.get_running_loop().time() - start < 1
        assert not p.pending
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(main())
    assert ended == ["cancelled"]


def test_a_doorbell_on_its_way_is_waited_for_and_a_failed_one_is_quiet():
    rung = []

    async def quick(bell, timeout):
        await asyncio.sleep(0.01)
        rung.append(bell)

    async def failing(bell, timeout):
        raise ConnectionError("the receiver left")

    async def main():
        p = _p2p(quick)
        p.send_on_loop("a", 1.0)
        await p.end(5)
        assert rung == ["a"] and not p.pending
        p = _p2p(failing)
        p.send_on_loop("b", 1.0)
        await asyncio.sleep(0.01)
        assert not p.pending  # done, its error retrieved (no "never retrieved" warning)
        await p.end(0)

    asyncio.run(main())
