"""Starting a rank: the one place a session is created and joined to its job.

Every way in uses it: :func:`minidist.init` (a loop in a background thread),
:func:`minidist.aio.init` (the caller's running loop), ``minidist.torch``'s bootstrap
from torch's store, calibration, and the tests (several ranks in one loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import fdlimits, job_secret
from .door import Door
from .env import LaunchConfig, log_level
from .runtime import Runtime
from .session import Session
from .shm import core

if TYPE_CHECKING:
    from .rendezvous.server import RendezvousServer

log = logging.getLogger("minidist.startup")
LOG_HANDLER = "minidist"  # the name of the handler configure_logging adds


def configure_logging(who: str) -> None:
    """With ``MINIDIST_LOG_LEVEL`` set, print minidist's log messages from that level up
    to stderr, each line naming ``who`` ("rank 3", "launcher"); once: while its handler
    (named :data:`LOG_HANDLER`) is there, a second call adds none."""
    level = log_level(os.environ)
    root = logging.getLogger("minidist")
    if level is None or any(h.get_name() == LOG_HANDLER for h in root.handlers):
        return
    if level not in logging.getLevelNamesMapping():
        raise ValueError(f"MINIDIST_LOG_LEVEL={level!r} is not a logging level (DEBUG, "
                         "INFO, WARNING, ERROR)")
    handler = logging.StreamHandler()
    handler.set_name(LOG_HANDLER)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s minidist {who} %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)


async def join(cfg: LaunchConfig, timeout: float,
               server: RendezvousServer | None = None) -> Session:
    """A session of this rank on the running loop, joined to its job (the welcome has
    come). ``server``: a rendezvous this process already runs, closed with the session
    once the other ranks have left. On failure, everything opened is closed again."""
    configure_logging(f"rank {cfg.rank}")
    # a rank holds a connection per peer it talks to: raise the soft limit, and fail
    # now, naming the limit, if even the hard one cannot be enough
    short = fdlimits.too_low(fdlimits.rank_needs(cfg.local_world_size, cfg.host_server or
                                                 cfg.host_agent),
                             f"rank {cfg.rank} of {cfg.world_size} "
                             f"({cfg.local_world_size} on this node)")
    if short is not None:
        raise short
    if cfg.share_secret or cfg.public_secret:  # no MINIDIST_SECRET: see job_secret
        cfg = await asyncio.to_thread(job_secret.resolve, cfg, timeout)
    session = Session(cfg, timeout)
    session.server = server
    try:
        await session.start()
    except BaseException:
        await session.close(graceful=False)
        raise
    finally:
        job_secret.joined(cfg)  # every rank has read it (or this init failed)
    log.info("rank %d of %d joined the job (launcher: %s)", cfg.rank, cfg.world_size,
             cfg.launcher)
    core.announce(cfg.rank)
    return session


async def join_all(cfgs: list[LaunchConfig], timeout: float) -> list[Session]:
    """Several ranks of one job in the running loop (calibration, tests)."""
    async with asyncio.timeout(timeout + 5):
        return list(await asyncio.gather(*(join(c, timeout) for c in cfgs)))


def start(cfg: LaunchConfig, timeout: float,
          host: tuple[str, int] | None = None,
          announce: Callable[[str, int], None] | None = None,
          watch: Callable[[], None] | None = None) -> Door:
    """Join the job from a blocking caller: a loop in a background thread, a session on
    it, and the door to both. With ``host`` (address, port; port 0: any free one), this
    process first runs the job's rendezvous there and calls ``announce(address, port)``
    so that the other ranks can find it (torch's store, for one). ``watch`` is called
    every 50 ms while the job gathers: what it raises (a rank's process that died before
    joining, say) ends the start at once and is raised here."""
    cfg = job_secret.resolve(cfg, timeout)  # the secret a rendezvous hosted here needs
    runtime = Runtime()
    server = None
    try:
        if host is not None:
            from .rendezvous.server import RendezvousServer  # only a rank that hosts it

            server = RendezvousServer(cfg.secret, cfg.world_size, host=host[0], port=host[1])
            port = runtime.call(server.start())
            if announce is not None:
                announce(host[0], port)
        if watch is None:
            session = runtime.call(join(cfg, timeout, server))
        else:
            session = _watched(runtime.submit(join(cfg, timeout, server)), watch)
    except BaseException:
        if server is not None:
            runtime.call(server.close())
        runtime.stop()
        job_secret.joined(cfg)
        raise
    return Door(session, runtime)


def _watched(joined: concurrent.futures.Future[Session], watch: Callable[[], None]) -> Session:
    """The session ``joined`` gives, calling ``watch`` every 50 ms until then; when
    ``watch`` raises, the join is cancelled (it closes what it opened)."""
    while True:
        try:
            return joined.result(timeout=0.05)
        except concurrent.futures.TimeoutError:
            pass
        try:
            watch()
        except BaseException:
            joined.cancel()
            raise
