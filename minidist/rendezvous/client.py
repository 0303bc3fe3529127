"""A rank's connection to the rendezvous: register, key/value requests, pushed events."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from .. import fdlimits, messages, wire
from ..errors import DistTimeoutError, PeerLostError, ProtocolError, RendezvousError
from ..transport import addresses
from ..transport.sockets import PeerClosed, connect_handshake
from .control import ControlReader, write_control

log = logging.getLogger("minidist.rendezvous")


def node_identity() -> str:
    """A string equal for processes of one node (host and network namespace)."""
    try:
        ns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        ns = 0
    return f"{socket.gethostname()}/{ns}"


class RendezvousClient:
    """One rank's control connection. Pushed events go to the callbacks:
    ``on_lost(rank, reason)`` (a rank died; -1: the rendezvous itself is gone),
    ``on_left(ranks)`` (ranks left normally), ``on_abort(abort)`` (a
    :class:`~minidist.messages.Abort`), and ``on_query(group) -> int``."""

    def __init__(self, secret: bytes, on_lost: Callable[[int, str], None],
                 on_abort: Callable[[messages.Abort], None], on_query: Callable[[int], int],
                 on_left: Callable[[list[int]], None] = lambda ranks: None) -> None:
        self.secret = secret
        self.job = addresses.job_key(secret)
        self.on_lost = on_lost
        self.on_left = on_left
        self.on_abort = on_abort
        self.on_query = on_query
        # a rank that died is back as a new process: on_back(rank, incarnation)
        self.on_back: Callable[[int, int], None] = lambda rank, incarnation: None
        self._reader: ControlReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._welcome: asyncio.Future | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self._joined = False  # welcomed: from now on, losing the rendezvous is news
        self.server_gone: str | None = None
        # what each message from the rendezvous does
        self._handlers: dict[type[messages.Message], Callable[[Any], None]] = {
            messages.Reply: self._on_reply, messages.Welcome: self._on_welcome,
            messages.Error: self._on_error, messages.Lost: self._on_lost,
            messages.Left: self._on_left, messages.Back: self._on_back,
            messages.Abort: self._on_abort, messages.Query: self._on_query}

    async def connect(self, host: str, port: int, timeout: float) -> None:
        """Connect to this node's agent (a Unix socket; the rendezvous itself on the first
        node), retrying until ``timeout``; RendezvousError if it refuses us. ``host`` and
        ``port`` only name the rendezvous in error messages: ranks never open TCP to it."""
        loop = asyncio.get_running_loop()
        self._closing = False
        self._joined = False
        self.server_gone = None
        last: Exception | None = None
        delay = 0.01
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    except OSError as e:  # out of descriptors: say so, now
                        raise fdlimits.exhausted(
                            e, "connecting to this node's minidist agent") or e from None
                    sock.setblocking(False)
                    try:
                        await loop.sock_connect(sock, addresses.agent_address(self.job))
                        await connect_handshake(sock, self.secret, wire.Role.PROCESS, -1, -1,
                                                timeout)
                    except RendezvousError:
                        sock.close()
                        raise
                    except (OSError, PeerClosed, ProtocolError) as e:
                        sock.close()
                        last = e
                        await asyncio.sleep(delay)
                        delay = min(delay * 1.5, 0.5)
                        continue
                    reader, self._writer = await asyncio.open_connection(sock=sock)
                    self._reader = ControlReader(reader)
                    self._task = loop.create_task(self._read_loop())
                    return
        except TimeoutError:
            if isinstance(last, PeerClosed):  # it took the connection and dropped it
                last = (f"{last}: the agent closed the connection before the handshake; "
                        "its own output says why (too many open files?)")
            raise DistTimeoutError(
                f"could not reach this node's minidist agent within {timeout:g} s ({last}); "
                f"is the launcher, rank 0 (rendezvous at {host}:{port}) or this node's local "
                "rank 0 running, with the same MINIDIST_PORT and secret?",
                collective="init") from None

    async def register(self, rank: int, world_size: int, local_rank: int,
                       timeout: float, read_key: str | None = None) -> dict[str, Any]:
        """Announce this rank (``read_key``: see :func:`minidist.peer_memory.key`); return
        the welcome once every rank has arrived."""
        self._welcome = asyncio.get_running_loop().create_future()
        self._send(messages.Register(rank=rank, world_size=world_size,
                                     local_rank=local_rank, node=node_identity(),
                                     pid=os.getpid(), reads=read_key))
        try:
            async with asyncio.timeout(timeout):
                welcome = await self._welcome
            self._welcome = None  # (as big as the world: the caller keeps what it needs)
            return welcome
        except TimeoutError:
            missing: list[int] = []
            with contextlib.suppress(Exception):
                joined = (await self.request(messages.Joined(), timeout=2.0)).value
                missing = sorted(set(range(world_size)) - set(joined))
            raise DistTimeoutError(
                f"rank {rank}: not every one of the {world_size} ranks joined the "
                f"rendezvous within {timeout:.0f} s"
                + (f"; ranks that never joined: {missing}" if missing else ""),
                collective="init", missing=missing) from None

    async def request(self, msg: messages.Message | Mapping[str, Any], blob: bytes = b"",
                      timeout: float = 300.0) -> messages.Reply:
        """Send a request (a message with an ``id`` field, or the JSON object and blob of
        one) and wait for its reply (RendezvousError if the server errs)."""
        if not isinstance(msg, messages.Message):
            msg = messages.parse(msg, blob)
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._send(replace(msg, id=rid))
        try:
            async with asyncio.timeout(timeout):
                reply: messages.Reply = await fut
        except TimeoutError:
            raise DistTimeoutError(f"rendezvous request {msg.type} timed out after "
                                   f"{timeout:.0f} s") from None
        finally:
            self._pending.pop(rid, None)
        err = reply.exception()
        if err is not None:
            raise err
        return reply

    def notify(self, msg: messages.Message) -> None:
        """Send a message that has no reply."""
        self._send(msg)

    async def close(self, graceful: bool = True) -> None:
        self._closing = True
        if self._writer is not None:
            if graceful:
                # the goodbye must reach the rendezvous, or the others hear "died": on a
                # crowded machine the loop may wait seconds for its turn, so wait for the
                # write (closing flushes what is still buffered) rather than give up
                with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
                    self._send(messages.Bye())
                    await asyncio.wait_for(self._writer.drain(), 10.0)
                    # then close only our sending half and read on until the rendezvous
                    # closes: were we to close while its news to us is in flight, its
                    # write would fail, and it could drop our goodbye with the connection
                    if self._writer.can_write_eof() and self._task is not None:
                        self._writer.write_eof()
                        await asyncio.wait_for(asyncio.shield(self._task), 10.0)
            self._writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._writer.wait_closed(), 10.0 if graceful else 2.0)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def _send(self, msg: messages.Message) -> None:
        if self._writer is None or self._writer.is_closing():
            raise PeerLostError(f"the rendezvous is gone: {self.server_gone or 'closed'}")
        write_control(self._writer, msg)

    async def _read_loop(self) -> None:
        reason = "the rendezvous closed the connection"
        try:
            while True:
                msg = await self._reader.read()
                if not self._closing:  # after our goodbye, news is no longer ours
                    self._dispatch(msg)
                del msg  # (a welcome is as big as the world: not held until the next)
        except asyncio.CancelledError:
            raise
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except ProtocolError as e:
            reason = f"protocol error from the rendezvous: {e}"
        self.server_gone = reason
        err = PeerLostError(f"lost the rendezvous: {reason}")
        if self._welcome is not None and not self._welcome.done():
            err.retry = True  # a previous init's rendezvous closing: the next one follows
            self._welcome.set_exception(err)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        if not self._closing and self._joined:  # before that, register() raises
            self.on_lost(-1, reason)

    def _dispatch(self, control: wire.Control) -> None:
        """Act on one message from the rendezvous (one of another version's types is
        logged and dropped; a message that lacks a field raises ProtocolError)."""
        try:
            msg = messages.decode(control)
        except messages.UnknownMessageError:
            log.warning("unknown message from the rendezvous: %r", control.type)
            return
        handler = self._handlers.get(type(msg))
        if handler is None:
            log.warning("unexpected message from the rendezvous: %r", msg.type)
            return
        handler(msg)

    def _on_reply(self, m: messages.Reply) -> None:
        fut = self._pending.get(m.id)
        if fut is not None and not fut.done():
            fut.set_result(m)

    def _on_welcome(self, m: messages.Welcome) -> None:
        if self._welcome is not None and not self._welcome.done():
            self._joined = True
            self._welcome.set_result(m.body)

    def _on_error(self, m: messages.Error) -> None:
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_exception(m.exception())

    def _on_lost(self, m: messages.Lost) -> None:
        self.on_lost(m.rank, m.reason)

    def _on_left(self, m: messages.Left) -> None:
        self.on_left(list(m.ranks))

    def _on_back(self, m: messages.Back) -> None:
        self.on_back(int(m.rank), int(m.incarnation))

    def _on_abort(self, m: messages.Abort) -> None:
        self.on_abort(m)

    def _on_query(self, m: messages.Query) -> None:
        self._send(messages.QueryReply(qid=m.qid, entered=self.on_query(m.group)))
