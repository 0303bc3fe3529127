"""The asyncio SharedArray (minidist.aio.shared_array): several ranks in one loop."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from minidist.door import Door
from minidist.errors import CollectiveMismatchError, DistError, DistTimeoutError
from minidist.shared_array import AsyncSharedArray

pytestmark = pytest.mark.timeout(60)


async def made(job, name="w", shape=(256,), dtype=np.float64, src=0, **kw):
    doors = [Door(s, None) for s in job]
    return await asyncio.gather(*(AsyncSharedArray.create(d, name, shape, dtype, src, **kw)
                                  for d in doors))


async def close_all(arrays):
    await asyncio.gather(*(a.close() for a in arrays))


async def test_waits_sleep_off_the_loop_and_wake_on_publish(job):
    arrays = await made(job)
    try:
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        t = asyncio.ensure_future(ticker())
        waits = [asyncio.ensure_future(a.wait(1, timeout=10)) for a in arrays[1:]]
        await asyncio.sleep(0.2)
        assert not any(w.done() for w in waits)
        assert ticks > 10  # the loop ran on while every reader waited
        assert await arrays[0].publish(np.arange(256.0)) == 1
        assert await asyncio.gather(*waits) == [1] * (len(job) - 1)
        t.cancel()
        for a in arrays[1:]:
            view, v = a.read()
            assert v == 1 and view.tolist() == list(range(256)) and not view.flags.writeable
        assert not [f for f in os.listdir("/dev/shm") if job[0].job in f]
    finally:
        await close_all(arrays)


async def test_a_wait_times_out_and_a_cancelled_wait_returns_at_once(job):
    arrays = await made(job)
    try:
        start = time.monotonic()
        with pytest.raises(DistTimeoutError, match="version 1 did not come"):
            await arrays[1].wait(1, timeout=0.3)
        assert 0.25 < time.monotonic() - start < 3
        w = asyncio.ensure_future(arrays[2].wait(1, timeout=30))
        await asyncio.sleep(0.05)
        w.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w
    finally:
        await close_all(arrays)


async def test_a_dtype_mismatch_raises_on_every_rank(job):
    doors = [Door(s, None) for s in job]
    got = await asyncio.gather(*(AsyncSharedArray.create(
        d, "m", (8,), np.float32 if i != 1 else np.float64, 0) for i, d in enumerate(doors)),
        return_exceptions=True)
    for e in got:
        assert isinstance(e, CollectiveMismatchError) and "rank 1" in str(e), got


async def test_the_publisher_waits_for_a_reader_that_holds_the_only_other_buffer(job):
    arrays = await made(job, buffers=2)
    try:
        pub, reader = arrays[0], arrays[1]
        await pub.publish(np.full(256, 1.0))
        held, v = reader.read()  # pins version 1
        assert v == 1
        await pub.publish(np.full(256, 2.0))  # the buffer of version 0 was free
        third = asyncio.ensure_future(pub.publish(np.full(256, 3.0)))
        await asyncio.sleep(0.3)
        assert not third.done()  # the only buffer left is the one the reader holds
        assert (held == 1.0).all()
        view, v = reader.read()  # moves on to version 2: version 1's buffer is free
        assert v == 2 and (view == 2.0).all()
        assert await asyncio.wait_for(third, 5) == 3
        assert (view == 2.0).all()  # the held version 2 is still intact
        assert reader.read()[1] == 3
    finally:
        await close_all(arrays)


async def test_no_room_in_dev_shm_raises_on_every_rank_and_leaves_nothing(job, monkeypatch):
    from minidist import segments

    monkeypatch.setattr(segments, "room", lambda: (60 << 20, 64 << 20))  # Docker's 64 MiB
    doors = [Door(s, None) for s in job]
    got = await asyncio.gather(*(AsyncSharedArray.create(d, "big", (256 << 20,), np.uint8, 0)
                                 for d in doors), return_exceptions=True)
    for e in got:
        assert isinstance(e, DistError) and "--shm-size" in e.args[0], got
        assert "768 MiB" in e.args[0] and "60 MiB free" in e.args[0], e
    assert not [f for f in os.listdir("/dev/shm") if job[0].job in f]
    monkeypatch.undo()  # the same name works once there is room
    arrays = await made(job, name="big", shape=(1 << 20,), dtype=np.uint8)
    await close_all(arrays)
