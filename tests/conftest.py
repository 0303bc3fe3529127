"""Shared fixtures: several ranks of one job in one event loop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from minidist.env import LaunchConfig
from minidist.session import Session
from minidist.startup import join_all


async def start_job(n: int, timeout: float = 10.0) -> list[Session]:
    """``n`` sessions of a fresh job in the running loop (rank 0 hosts the rendezvous)."""
    secret = os.urandom(12).hex().encode()
    return await join_all([LaunchConfig(r, n, r, n, "127.0.0.1", 0, secret, r == 0, "test")
                           for r in range(n)], timeout)


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
