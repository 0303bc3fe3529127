"""``wait_ranks`` sleeps until the rendezvous says a rank is back, or until its timeout:
it does not wake to look in between (at 1023 workers, ranks that woke every 50 ms to look
took more CPU than two cores have, and slowed the survivors still shrinking). A fake
session stands in for the rank's engine; the looks are counted where the engine is asked
whether a rank is lost."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from minidist.elastic import Elastic


class CountedDict(dict):
    """A dict that counts how often it is asked whether it holds a key."""

    looks = 0

    def __contains__(self, key: object) -> bool:
        CountedDict.looks += 1
        return super().__contains__(key)


def fake_session(world: int, lost: list[int]) -> SimpleNamespace:
    engine = SimpleNamespace(lost=CountedDict({r: "killed" for r in lost}),
                             left=CountedDict())
    engine.peer_back = lambda rank, incarnation: engine.lost.pop(rank, None)
    return SimpleNamespace(cfg=SimpleNamespace(world_size=world), rank=0, timeout=30.0,
                           engine=engine, plan=SimpleNamespace(incarnations=None),
                           p2p=None, endpoint=None)


@pytest.mark.timeout(20)
def test_waits_without_looking_until_the_rank_is_back() -> None:
    async def main() -> tuple[list[int], float, int]:
        s = fake_session(4, lost=[2])
        e = Elastic(s)
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, e.rank_back, 2, 1)
        CountedDict.looks = 0
        t0 = time.monotonic()
        back = await e.wait_ranks([2], timeout=10.0)
        return back, time.monotonic() - t0, CountedDict.looks

    back, took, looks = asyncio.run(main())
    assert back == [2]
    assert 0.9 < took < 5.0
    # one look when the call starts and one when the news comes: a look every 50 ms
    # would make about 20 in the second the test waits
    assert looks <= 4, f"wait_ranks looked {looks} times in {took:.2f} s"


@pytest.mark.timeout(20)
def test_times_out_without_looking_in_between() -> None:
    async def main() -> tuple[list[int], float, int]:
        e = Elastic(fake_session(4, lost=[1, 3]))
        CountedDict.looks = 0
        t0 = time.monotonic()
        back = await e.wait_ranks([1, 3], timeout=1.0)
        return back, time.monotonic() - t0, CountedDict.looks

    back, took, looks = asyncio.run(main())
    assert back == []
    assert 0.9 < took < 5.0
    assert looks <= 6, f"wait_ranks looked {looks} times in {took:.2f} s"


@pytest.mark.timeout(20)
def test_one_rank_back_of_two_keeps_waiting_for_the_other() -> None:
    async def main() -> tuple[list[int], float]:
        e = Elastic(fake_session(4, lost=[1, 3]))
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, e.rank_back, 1, 1)
        loop.call_later(0.6, e.rank_back, 3, 1)
        t0 = time.monotonic()
        back = await e.wait_ranks([1, 3], timeout=10.0)
        return back, time.monotonic() - t0

    back, took = asyncio.run(main())
    assert back == [1, 3]
    assert 0.5 < took < 5.0
