"""Shared fixtures: several ranks of one job in one event loop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from minidist.env import LaunchConfig
from minidist.session import Session


async def start_job(n: int, timeout: float = 10.0) -> list[Session]:
    """``n`` sessions of a fresh job in the running loop (rank 0 hosts the rendezvous)."""
    secret = os.urandom(12).hex().encode()
    sessions = [Session(LaunchConfig(r, n, r, n, "127.0.0.1", 0, secret, r == 0, "test"),
                        timeout) for r in range(n)]
    async with asyncio.timeout(timeout + 5):
        async with asyncio.TaskGroup() as tg:
            for s in sessions:
                tg.create_task(s.start())
    return sessions


async def stop_job(sessions: list[Session]) -> None:
    # rank 0 hosts the server: it leaves last
    await asyncio.gather(*(s.close(graceful=True) for s in sessions[1:]),
                         return_exceptions=True)
    await sessions[0].close(graceful=True)


@pytest.fixture
async def job(request) -> AsyncIterator[list[Session]]:
    """A job of ``request.param`` ranks (default 4), closed after the test."""
    n = getattr(request, "param", 4)
    sessions = await start_job(n)
    try:
        yield sessions
    finally:
        await stop_job(sessions)
