"""Accepting connections on listening sockets, one task per connection."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Coroutine
from typing import Any

from .sockets import tune_tcp


class Acceptor:
    """Base for servers: ``_accept_loop(listener)`` runs ``_session(sock)`` for every
    connection (TCP ones tuned); tasks live in ``_tasks`` until done; set ``_closed``
    before closing the listeners."""

    _tasks: set[asyncio.Task]
    _closed: bool

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError:
                if self._closed:
                    return
                await asyncio.sleep(0.05)
                continue
            sock.setblocking(False)
            if sock.family == socket.AF_INET:
                tune_tcp(sock)
            self._spawn(self._session(sock))

    async def _session(self, sock: socket.socket) -> None:
        raise NotImplementedError
