"""A shared-memory set-up's messages to a group's members: many at once, bounded, in
order, and the first failure raised as itself."""

import asyncio

import pytest

from minidist.errors import PeerLostError
from minidist.shm import shared_setup


def test_every_member_is_served_at_once_up_to_the_fan_out_and_answers_keep_their_order():
    async def go():
        flying = most = 0

        async def work(r: int) -> int:
            nonlocal flying, most
            flying += 1
            most = max(most, flying)
            await asyncio.sleep(0.001 * (r % 3))
            flying -= 1
            return r * r

        ranks = list(range(1, 200))
        answers = await asyncio.wait_for(shared_setup._each(ranks, work), 30)
        return answers, most

    answers, most = asyncio.run(go())
    assert answers == [r * r for r in range(1, 200)]
    assert most == shared_setup.FAN_OUT


def test_the_first_failure_is_raised_as_itself_and_the_rest_is_cancelled():
    cancelled = []

    async def go():
        async def work(r: int) -> None:
            if r == 5:
                raise PeerLostError("rank 5 is gone", ranks=[5])
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(r)
                raise

        await asyncio.wait_for(shared_setup._each(list(range(1, 10)), work), 30)

    with pytest.raises(PeerLostError, match="rank 5 is gone"):
        asyncio.run(go())
    assert sorted(cancelled) == [1, 2, 3, 4, 6, 7, 8, 9]
