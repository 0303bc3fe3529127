"""A process's endpoint: its Unix-socket listener and its lazily opened peer connections."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import threading
from collections.abc import Callable

from .. import wire
from ..errors import PeerLostError, ProtocolError, RendezvousError
from . import addresses
from .mailbox import Mailbox
from .reader import FrameReader
from .sockets import (
    PeerClosed,
    accept_handshake,
    connect_handshake,
    nonblocking_unix_socket,
    recv_fd,
    send_all,
    tune_tcp,
)

log = logging.getLogger("minidist.transport")

HANDSHAKE_TIMEOUT = 10.0
_DISCARD = 1 << 20


SEND_NOW_MAX = 4096  # frames up to this size may be written from the caller's thread


class Connection:
    """One authenticated stream socket to one peer rank; frames are never interleaved.

    Frames are written on the event loop, except small ones that the caller's thread may
    write itself (:meth:`send_now`); ``_writing`` is held by whichever thread writes a
    frame, from its first byte to its last.
    """

    def __init__(self, sock: socket.socket, peer: int) -> None:
        self.sock = sock
        self.peer = peer
        self.lock = asyncio.Lock()
        self.reader: FrameReader | None = None
        self.unix = sock.family == socket.AF_UNIX
        self._writing = threading.Lock()
        self._tail: asyncio.Task | None = None

    async def send(self, header: bytes, payload: memoryview | None) -> None:
        async with self.lock:
            while not self._writing.acquire(blocking=False):
                # another thread is writing one small frame (microseconds), or the loop
                # finishes what it began (see send_now)
                await asyncio.sleep(0 if self._tail is None else 0.001)
            try:
                await send_all(self.sock, [header] if payload is None else [header, payload])
            finally:
                self._writing.release()

    def send_now(self, loop: asyncio.AbstractEventLoop, header: bytes,
                 payload: memoryview | None) -> bool:
        """From any thread: write one frame of at most SEND_NOW_MAX bytes now, if no other
        frame is being written and the socket takes it without waiting. True if the frame
        is on its way (the loop finishes a partial write), False if nothing was written."""
        parts = [header] if payload is None else [header, payload]
        nbytes = len(header) + (0 if payload is None else payload.nbytes)
        if nbytes > SEND_NOW_MAX or not self._writing.acquire(blocking=False):
            return False
        try:
            sent = self.sock.sendmsg(parts, [], socket.MSG_DONTWAIT)
        except OSError:  # would block, or broken: the loop's own send will find out
            self._writing.release()
            return False
        if sent == nbytes:
            self._writing.release()
            return True
        # a Unix socket takes a frame this small whole or not at all; TCP may not
        rest = b"".join(bytes(p) for p in parts)[sent:]
        loop.call_soon_threadsafe(self._finish, rest)
        return True

    def _finish(self, rest: bytes) -> None:
        async def finish() -> None:
            try:
                await send_all(self.sock, [rest])
            except OSError:
                pass  # the reader sees the broken connection
            finally:
                self._tail = None
                self._writing.release()

        self._tail = asyncio.get_running_loop().create_task(finish())

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        if self._tail is not None:
            self._tail.cancel()
        # not while another thread is inside a system call on this socket
        writing = self._writing.acquire(timeout=0.05)
        with contextlib.suppress(OSError):
            self.sock.close()
        if writing:
            self._writing.release()


class Endpoint:
    """Listens on this rank's Unix address; connects to peers on first use.

    Each peer is reached through one chosen connection (the first one open, whichever
    side opened it), so frames from one sender to one receiver keep their order.
    Every connection has a reader that matches incoming frames in the :class:`Mailbox`.
    ``on_lost(rank, reason)`` is called when a connection to a peer breaks.
    """

    def __init__(self, job: str, rank: int, secret: bytes, mailbox: Mailbox,
                 on_lost: Callable[[int, str], None],
                 connect_timeout: float = 60.0) -> None:
        self.job = job
        self.rank = rank
        self.secret = secret
        self.mailbox = mailbox
        self.on_lost = on_lost
        self.connect_timeout = connect_timeout
        self._listener: socket.socket | None = None
        self._chosen: dict[int, Connection] = {}
        self._all: set[Connection] = set()
        self._connecting: dict[int, asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        # global rank -> (host, port) of its node's agent, for ranks on other nodes
        self.remote: dict[int, tuple[str, int]] = {}

    async def start(self) -> None:
        """Bind and listen on this rank's address."""
        s = nonblocking_unix_socket()
        try:
            s.bind(addresses.peer_address(self.job, self.rank))
        except OSError as e:
            s.close()
            raise OSError(e.errno, f"rank {self.rank} cannot listen: {e.strerror}"
                          " (is another process of this job using the same rank?)") from e
        s.listen(socket.SOMAXCONN)
        self._listener = s
        self._spawn(self._accept_loop())

    async def close(self) -> None:
        """Close every socket and stop every task of this endpoint."""
        self._closed = True
        if self._listener is not None:
            self._listener.close()
            if not addresses.ABSTRACT:
                with contextlib.suppress(OSError):
                    import os

                    os.unlink(addresses.peer_address(self.job, self.rank))
        for c in list(self._all):
            c.close()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._all.clear()
        self._chosen.clear()

    def peers(self) -> list[int]:
        """The ranks this endpoint currently holds a connection to."""
        return sorted({c.peer for c in self._all})

    def connected(self, dst: int) -> Connection | None:
        """The open connection to global rank ``dst``, if there is one (any thread)."""
        return None if self._closed else self._chosen.get(dst)

    async def send(self, dst: int, header: bytes, payload: memoryview | None) -> None:
        """Send one frame to global rank ``dst``; PeerLostError if it cannot be reached."""
        conn = self._chosen.get(dst)
        if conn is None:
            conn = await self._connect(dst)
        try:
            await conn.send(header, payload)
        except OSError as e:
            self._lost(conn, f"send failed: {e}")
            raise PeerLostError(f"rank {dst} was lost: {e}", ranks=[dst]) from None

    # ------------------------------------------------------------------ internals

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except OSError as e:
                if self._closed:
                    return
                log.warning("accept failed on rank %d: %s", self.rank, e)
                await asyncio.sleep(0.05)
                continue
            sock.setblocking(False)
            self._spawn(self._admit(sock))

    async def _admit(self, sock: socket.socket) -> None:
        try:
            hello = await accept_handshake(sock, self.secret, wire.Role.PEER,
                                           (wire.Role.PEER, wire.Role.AGENT), self.rank,
                                           HANDSHAKE_TIMEOUT)
            if hello.role == wire.Role.AGENT:  # the node agent hands over a TCP connection
                try:
                    async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                        fd = await recv_fd(sock)
                finally:
                    sock.close()
                sock = socket.socket(fileno=fd)
                sock.setblocking(False)
                tune_tcp(sock)
                await send_all(sock, [wire.encode_ack(wire.AckStatus.OK)])
        except (OSError, ProtocolError, TimeoutError, PeerClosed) as e:
            log.warning("rank %d dropped a connection that failed the handshake: %s",
                        self.rank, e)
            sock.close()
            return
        self._register(Connection(sock, hello.src))

    def _register(self, conn: Connection) -> None:
        self._all.add(conn)
        self._chosen.setdefault(conn.peer, conn)
        conn.reader = FrameReader(conn.sock, conn.peer, self.mailbox,
                                  lambda reason: self._lost(conn, reason))

    async def _connect(self, dst: int) -> Connection:
        if dst == self.rank:
            raise ValueError("a rank cannot connect to itself")
        dead = self.mailbox.is_dead(dst)
        if dead is not None:
            raise dead
        pending = self._connecting.get(dst)
        if pending is None:
            pending = asyncio.ensure_future(self._open(dst))
            self._connecting[dst] = pending
            pending.add_done_callback(lambda _f: self._connecting.pop(dst, None))
        return await asyncio.shield(pending)

    async def _open(self, dst: int) -> Connection:
        """Connect, retrying while the peer's backlog is full or it is not listening yet."""
        loop = asyncio.get_running_loop()
        route = self.remote.get(dst)
        addr = route if route is not None else addresses.peer_address(self.job, dst)
        delay = 0.001
        last: Exception | None = None
        try:
            async with asyncio.timeout(self.connect_timeout):
                while True:
                    if dst in self._chosen:
                        return self._chosen[dst]
                    if route is None:
                        sock = nonblocking_unix_socket()
                    else:  # another node: through its agent's TCP port
                        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                        sock.setblocking(False)
                        tune_tcp(sock)
                    try:
                        await loop.sock_connect(sock, addr)
                        await connect_handshake(sock, self.secret, wire.Role.PEER, self.rank,
                                                dst, HANDSHAKE_TIMEOUT)
                    except (OSError, PeerClosed, ProtocolError) as e:
                        sock.close()
                        last = e
                        if isinstance(e, OSError) and e.errno not in (
                                errno.ECONNREFUSED, errno.ENOENT, errno.EAGAIN,
                                errno.ECONNRESET, errno.EPIPE, None):
                            raise
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 0.2)
                        continue
                    conn = Connection(sock, dst)
                    self._register(conn)
                    return self._chosen[dst]
        except RendezvousError as e:  # its node's agent could not hand us over
            raise PeerLostError(f"rank {self.rank} could not reach rank {dst}: {e}",
                                ranks=[dst]) from None
        except TimeoutError:
            raise PeerLostError(f"rank {self.rank} could not reach rank {dst} within "
                                f"{self.connect_timeout:.0f} s: {last}", ranks=[dst]) from None

    def _lost(self, conn: Connection, reason: str) -> None:
        conn.close()
        self._all.discard(conn)
        if self._chosen.get(conn.peer) is conn:
            del self._chosen[conn.peer]
            other = next((c for c in self._all if c.peer == conn.peer), None)
            if other is not None:
                self._chosen[conn.peer] = other
        if not self._closed and not any(c.peer == conn.peer for c in self._all):
            self.on_lost(conn.peer, reason)
