"""The background loop of a blocking caller (minidist.runtime): what is still running on
it when it stops is cancelled and ends, not dropped."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from minidist.runtime import Runtime

pytestmark = pytest.mark.timeout(30)


def test_a_task_pending_when_the_loop_stops_is_cancelled_and_ends():
    ended = []

    async def forever():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    async def failing_on_cancel():
        try:
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("from its clean-up")  # retrieved, not logged

    rt = Runtime()
    future = rt.submit(forever())
    rt.submit(failing_on_cancel())
    assert rt.call(asyncio.sleep(0.01, "ok")) == "ok"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt.stop()
        gc.collect()
    assert ended == ["cancelled"]
    assert future.cancelled()
    assert rt.loop.is_closed()
    rt.stop()  # again: nothing
