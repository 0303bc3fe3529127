"""A process's endpoint: its Unix-socket listener and its lazily opened peer connections."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import threading
from collections.abc import Callable

from .. import fdlimits, wire
from ..errors import PeerLostError, ProtocolError, RendezvousError
from . import addresses
from .mailbox import Mailbox
from .reader import FrameReader
from .sockets import (
    PeerClosed,
    accept_handshake,
    connect_handshake,
    handshake_failures,
    nonblocking_unix_socket,
    recv_fd,
    send_all,
    tune_tcp,
)

log = logging.getLogger("minidist.transport")

HANDSHAKE_TIMEOUT = 10.0


SEND_NOW_MAX = 4096  # frames up to this size may be written from the caller's thread


class Connection:
    """One authenticated stream socket to one peer rank; frames are never interleaved.

    Frames are written on the event loop, except small ones that the caller's thread may
    write itself (:meth:`send_now`); ``_writing`` is held by whichever thread writes a
    frame, from its first byte to its last.
    """

    def __init__(self, sock: socket.socket, peer: int, incarnation: int = 0) -> None:
        self.sock = sock
        self.peer = peer
        self.incarnation = incarnation  # of the peer's rank (restarts, mod 65536)
        self.lock = asyncio.Lock()
        self.reader: FrameReader | None = None
        self.unix = sock.family == socket.AF_UNIX
        self._writing = threading.Lock()
        self._tail: asyncio.Task | None = None

    async def send(self, header: bytes, payload: memoryview | None) -> None:
        """Write one frame. A frame, once begun, is always finished (or the connection
        closed): if the caller gives up (a deadline, a failure elsewhere), the rest is
        written in the background, so the stream never carries half a frame."""
        async with self.lock:
            while self._tail is not None:  # the rest of an earlier frame
                await asyncio.wait([self._tail])
            while not self._writing.acquire(blocking=False):
                await asyncio.sleep(0)  # the caller's thread writes one small frame
            parts = [header] if payload is None else [header, payload]
            try:
                sent = self.sock.sendmsg(parts)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except BaseException:
                self._writing.release()
                raise
            rest = _after(parts, sent)
            if not rest:
                self._writing.release()
                return
            tail = self._write_rest(rest)
        await asyncio.shield(tail)

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
        rest = [b"".join(bytes(p) for p in parts)[sent:]]
        loop.call_soon_threadsafe(self._write_rest, rest)
        return True

    def _write_rest(self, rest: list[memoryview]) -> asyncio.Task:
        """On the loop, holding ``_writing``: write the rest of a frame in a task of its
        own, which releases ``_writing`` when done."""
        async def finish() -> None:
            try:
                loop = asyncio.get_running_loop()
                for part in rest:
                    await loop.sock_sendall(self.sock, part)
            finally:
                self._tail = None
                self._writing.release()

        self._tail = asyncio.get_running_loop().create_task(finish())
        # a broken socket is the reader's news; nobody may be waiting for this task
        self._tail.add_done_callback(lambda t: t.cancelled() or t.exception())
        return self._tail

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


def _after(parts: list, sent: int) -> list[memoryview]:
    """What is left of ``parts`` once ``sent`` bytes of them were written."""
    rest = []
    for p in parts:
        p = memoryview(p).cast("B")
        if sent >= p.nbytes:
            sent -= p.nbytes
            continue
        rest.append(p[sent:])
        sent = 0
    return rest


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
        self._gone: dict[int, Exception] = {}  # ranks never to be connected to again
        # how often each rank was restarted (absent: never), as the rendezvous told us; a
        # connection from another incarnation than the current one is refused
        self.incarnation = 0  # this rank's own
        self.incarnations: dict[int, int] = {}
        self._revived: dict[int, asyncio.Event] = {}
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

    def forbid(self, rank: int, exc: Exception) -> None:
        """``rank`` is gone: never connect to it again; a connection attempt in progress
        ends now with ``exc``."""
        self._gone.setdefault(rank, exc)
        pending = self._connecting.get(rank)
        if pending is not None:
            pending.cancel()

    def revive(self, rank: int, incarnation: int) -> None:
        """``rank`` is back as a new incarnation (a restarted process): it may be
        connected to again; connections of its earlier incarnations are dropped without
        a word to anyone."""
        self.incarnations[rank] = incarnation & 0xFFFF
        self._gone.pop(rank, None)
        for c in [c for c in self._all if c.peer == rank and c.incarnation != incarnation]:
            c.close()
            self._all.discard(c)
            if self._chosen.get(rank) is c:
                del self._chosen[rank]
        ev = self._revived.pop(rank, None)
        if ev is not None:
            ev.set()

    async def _current(self, hello: wire.Hello) -> bool:
        """Whether a connection from ``hello``'s incarnation of its rank is to be taken:
        an earlier one never; a later one once the rendezvous' news of it has come."""
        known = self.incarnations.get(hello.src, 0)
        if hello.incarnation == known:
            return True
        if (hello.incarnation - known) & 0xFFFF >= 0x8000:  # an earlier incarnation
            return False
        ev = self._revived.setdefault(hello.src, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                while self.incarnations.get(hello.src, 0) != hello.incarnation:
                    await ev.wait()
                    ev = self._revived.setdefault(hello.src, asyncio.Event())
        return self.incarnations.get(hello.src, 0) == hello.incarnation

    def has_connection(self, rank: int) -> bool:
        """True while some connection with ``rank`` (either side's) is open."""
        return any(c.peer == rank for c in self._all)

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
            hello, _ = await accept_handshake(sock, self.secret, wire.Role.PEER,
                                              (wire.Role.PEER, wire.Role.AGENT), self.rank,
                                              HANDSHAKE_TIMEOUT)
            if hello.role == wire.Role.AGENT:  # the node agent hands over a TCP connection
                try:
                    async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                        fd, nonces = await recv_fd(sock, 32)
                finally:
                    sock.close()
                sock = socket.socket(fileno=fd)
                sock.setblocking(False)
                tune_tcp(sock)
                # the connector's hello was checked by the agent; prove we know the secret
                await send_all(sock, [wire.encode_ack(wire.AckStatus.OK, self.secret,
                                                      nonces[:16], nonces[16:])])
        except (OSError, ProtocolError, TimeoutError, PeerClosed) as e:
            handshake_failures.note(log, f"rank {self.rank}", e)
            sock.close()
            return
        if hello.incarnation != self.incarnations.get(hello.src, 0) and \
                not await self._current(hello):  # an incarnation of the rank that is gone
            sock.close()
            return
        if hello.src in self._gone:  # a rank declared gone is never talked to again
            sock.close()
            return
        self._register(Connection(sock, hello.src, hello.incarnation))

    def _register(self, conn: Connection) -> None:
        self._all.add(conn)
        self._chosen.setdefault(conn.peer, conn)
        conn.reader = FrameReader(conn.sock, conn.peer, self.mailbox,
                                  lambda reason: self._lost(conn, reason))

    async def _connect(self, dst: int) -> Connection:
        if dst == self.rank:
            raise ValueError("a rank cannot connect to itself")
        dead = self._gone.get(dst) or self.mailbox.is_dead(dst)
        if dead is not None:
            raise dead
        pending = self._connecting.get(dst)
        if pending is None:
            pending = asyncio.ensure_future(self._open(dst))
            self._connecting[dst] = pending
            pending.add_done_callback(lambda _f: self._connecting.pop(dst, None))
        # shared by every sender to dst: one giving up does not end the attempt
        await asyncio.wait([pending])
        if pending.cancelled():  # forbidden while connecting
            raise self._gone.get(dst) or PeerLostError(
                f"rank {self.rank} could not reach rank {dst}: the endpoint closed",
                ranks=[dst])
        return pending.result()

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
                    if dst in self._gone:
                        raise self._gone[dst]
                    try:
                        if route is None:
                            sock = nonblocking_unix_socket()
                        else:  # another node: through its agent's TCP port
                            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                            sock.setblocking(False)
                            tune_tcp(sock)
                    except OSError as e:  # out of descriptors: say so, now
                        raise fdlimits.exhausted(e, f"rank {self.rank} connecting to rank "
                                                 f"{dst}") or e from None
                    try:
                        await loop.sock_connect(sock, addr)
                        await connect_handshake(sock, self.secret, wire.Role.PEER, self.rank,
                                                dst, HANDSHAKE_TIMEOUT, self.incarnation)
                    except (OSError, PeerClosed, ProtocolError) as e:
                        sock.close()
                        last = e
                        if isinstance(e, ProtocolError):  # not the rank: someone else
                            handshake_failures.note(log, f"rank {self.rank}", e)
                        if isinstance(e, OSError) and e.errno not in (
                                errno.ECONNREFUSED, errno.ENOENT, errno.EAGAIN,
                                errno.ECONNRESET, errno.EPIPE, None):
                            raise
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 0.2)
                        continue
                    conn = Connection(sock, dst, self.incarnations.get(dst, 0))
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
        if conn not in self._all:  # dropped already (an earlier incarnation's)
            return
        self._all.discard(conn)
        if self._chosen.get(conn.peer) is conn:
            del self._chosen[conn.peer]
            other = next((c for c in self._all if c.peer == conn.peer), None)
            if other is not None:
                self._chosen[conn.peer] = other
        if not self._closed and not any(c.peer == conn.peer for c in self._all):
            self.on_lost(conn.peer, reason)
