"""Starting a rank: the one place a session is created and joined to its job.

Every way in uses it: :func:`minidist.init` (a loop in a background thread),
:func:`minidist.aio.init` (the caller's running loop), ``minidist.torch``'s bootstrap
from torch's store, calibration, and the tests (several ranks in one loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .door import Door
from .env import LaunchConfig
from .rendezvous.server import RendezvousServer
from .runtime import Runtime
from .session import Session


async def join(cfg: LaunchConfig, timeout: float,
               server: RendezvousServer | None = None) -> Session:
    """A session of this rank on the running loop, joined to its job (the welcome has
    come). ``server``: a rendezvous this process already runs, closed with the session
    once the other ranks have left. On failure, everything opened is closed again."""
    session = Session(cfg, timeout)
    session.server = server
    try:
        await session.start()
    except BaseException:
        await session.close(graceful=False)
        raise
    return session


async def join_all(cfgs: list[LaunchConfig], timeout: float) -> list[Session]:
    """Several ranks of one job in the running loop (calibration, tests)."""
    async with asyncio.timeout(timeout + 5):
        return list(await asyncio.gather(*(join(c, timeout) for c in cfgs)))


def start(cfg: LaunchConfig, timeout: float,
          host: tuple[str, int] | None = None,
          announce: Callable[[str, int], None] | None = None) -> Door:
    """Join the job from a blocking caller: a loop in a background thread, a session on
    it, and the door to both. With ``host`` (address, port; port 0: any free one), this
    process first runs the job's rendezvous there and calls ``announce(address, port)``
    so that the other ranks can find it (torch's store, for one)."""
    runtime = Runtime()
    server = None
    try:
        if host is not None:
            server = RendezvousServer(cfg.secret, cfg.world_size, host=host[0], port=host[1])
            port = runtime.call(server.start())
            if announce is not None:
                announce(host[0], port)
        session = runtime.call(join(cfg, timeout, server))
    except BaseException:
        if server is not None:
            runtime.call(server.close())
        runtime.stop()
        raise
    return Door(session, runtime)
