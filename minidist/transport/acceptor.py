"""Accepting connections on listening sockets, one task per connection."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from .. import fdlimits, wire
from ..errors import ProtocolError
from .handoff import hand_over
from .sockets import PeerClosed, accept_handshake, handshake_failures, send_all, tune_tcp

log = logging.getLogger("minidist.transport")
HANDSHAKE_TIMEOUT = 10.0


class Acceptor:
    """Base for servers: ``_accept_loop(listener)`` runs ``_session(sock)`` for every
    connection (TCP ones tuned); tasks live in ``_tasks`` until done; set ``_closed``
    before closing the listeners. ``on_exhausted``, if set, hears of an accept that
    failed for want of file descriptors (the launcher fails the job with it)."""

    _tasks: set[asyncio.Task]
    _closed: bool
    secret: bytes
    job: str
    on_exhausted: Callable[[fdlimits.FileLimitError], None] | None = None
    _reserve: fdlimits.Reserve | None = None

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("%s: a connection's task failed", type(self).__name__,
                      exc_info=t.exception())

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        if self._reserve is None:
            self._reserve = fdlimits.Reserve()
        while not self._closed:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as e:
                if self._closed:
                    return
                if e.errno in fdlimits.EXHAUSTION:  # refuse one, say why, tell the owner
                    err = self._reserve.shed(listener, e, type(self).__name__)
                    if self.on_exhausted is not None:
                        self.on_exhausted(err)
                await asyncio.sleep(0.05)
                continue
            sock.setblocking(False)
            if sock.family == socket.AF_INET:
                tune_tcp(sock)
            self._spawn(self._session(sock))

    async def _session(self, sock: socket.socket) -> None:
        raise NotImplementedError

    async def _greet(self, sock: socket.socket, roles: tuple[wire.Role, ...],
                     what: str) -> wire.Hello | None:
        """Check a new connection's hello. A rank of another node is handed over to the
        rank it is for (None); a rank or agent of this job is acked (its Hello); a
        stranger is dropped (None)."""
        try:
            hello, nonce = await accept_handshake(sock, self.secret, wire.Role.AGENT, roles,
                                                  -1, HANDSHAKE_TIMEOUT, ack=False)
            if hello.role == wire.Role.PEER:
                await hand_over(sock, hello, nonce, self.job, self.secret, HANDSHAKE_TIMEOUT)
                return None
            await send_all(sock, [wire.encode_ack(wire.AckStatus.OK, self.secret, nonce,
                                                  hello.nonce)])
            return hello
        except (OSError, ProtocolError, TimeoutError, PeerClosed) as e:
            handshake_failures.note(log, what, e)
            sock.close()
            return None
