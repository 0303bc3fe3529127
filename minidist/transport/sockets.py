"""Small asyncio helpers over non-blocking sockets: exact reads, vectored writes, handshakes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import time

from .. import wire
from ..errors import ProtocolError, RendezvousError


class PeerClosed(ConnectionError):
    """The other end closed the connection."""


async def recv_exactly_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; PeerClosed if the stream ends first."""
    loop = asyncio.get_running_loop()
    while view.nbytes:
        n = await loop.sock_recv_into(sock, view)
        if n == 0:
            raise PeerClosed("connection closed by peer")
        view = view[n:]


async def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    await recv_exactly_into(sock, memoryview(buf))
    return bytes(buf)


async def send_all(sock: socket.socket, parts: list[memoryview | bytes]) -> None:
    """Send every part in order, in one system call when the kernel takes it all."""
    try:
        sent = sock.sendmsg(parts)
    except (BlockingIOError, InterruptedError):
        sent = 0
    parts = [memoryview(p).cast("B") for p in parts]
    if sent == sum(p.nbytes for p in parts):
        return
    loop = asyncio.get_running_loop()
    for p in parts:
        if sent >= p.nbytes:
            sent -= p.nbytes
            continue
        await loop.sock_sendall(sock, p[sent:])
        sent = 0


def nonblocking_unix_socket() -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    return s


def peer_uid(sock: socket.socket) -> int | None:
    """The user id of the process at the other end of a Unix socket (SO_PEERCRED), or
    None where the system cannot tell."""
    if sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", creds)[1]


def check_peer_uid(sock: socket.socket) -> None:
    """ProtocolError if a Unix socket's other end runs as another user than this process
    (minidist's Unix addresses are visible to every local user)."""
    uid = peer_uid(sock)
    if uid is not None and uid != os.geteuid():
        raise ProtocolError(f"the other end of a Unix socket runs as uid {uid}, not this "
                            f"job's uid {os.geteuid()}")


class HandshakeFailures:
    """Counts connections refused by the handshake; logs them at most once a minute, so
    that a stranger hammering a port cannot flood the job's output."""

    EVERY = 60.0

    def __init__(self) -> None:
        self.total = 0
        self._since = 0
        self._last = -float("inf")

    def note(self, logger: logging.Logger, where: str, err: BaseException) -> None:
        self.total += 1
        self._since += 1
        now = time.monotonic()
        if now - self._last >= self.EVERY:
            logger.warning("%s refused %d connection(s) that failed the handshake since the "
                           "last report (latest: %s)", where, self._since, err)
            self._since = 0
            self._last = now


handshake_failures = HandshakeFailures()


async def accept_handshake(sock: socket.socket, secret: bytes, my_role: wire.Role,
                           expect_role: wire.Role | tuple[wire.Role, ...], my_rank: int,
                           timeout: float, ack: bool = True) -> tuple[wire.Hello, bytes]:
    """Run the acceptor's side of the handshake; return (the connector's hello, the
    challenge nonce). ProtocolError (and nothing else read) if the connector does not
    prove it knows the secret, or runs as another user. With ``ack`` False the caller
    answers later (an agent handing the connection over to the rank it is for)."""
    roles = expect_role if isinstance(expect_role, tuple) else (expect_role,)
    check_peer_uid(sock)
    nonce = os.urandom(16)
    async with asyncio.timeout(timeout):
        await send_all(sock, [wire.encode_challenge(my_role, nonce)])
        hello = wire.decode_hello(await recv_exactly(sock, wire.HELLO_SIZE))
        if not hello.verify(secret, nonce) or hello.role not in roles:
            await _try_send(sock, wire.encode_ack(wire.AckStatus.BAD_SECRET))
            raise ProtocolError("handshake failed: the connector does not know the job secret")
        if my_rank >= 0 and hello.dst != my_rank:
            await _try_send(sock, wire.encode_ack(wire.AckStatus.WRONG_DESTINATION))
            raise ProtocolError(f"handshake for rank {hello.dst} reached rank {my_rank}")
        if ack:
            await send_all(sock, [wire.encode_ack(wire.AckStatus.OK, secret, nonce,
                                                  hello.nonce)])
    return hello, nonce


def tune_tcp(sock: socket.socket) -> None:
    """TCP options for minidist's connections: no Nagle delay, and a dead peer host
    noticed in seconds (keep-alive probes, and unacknowledged data timing out)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", 6000)):
        if hasattr(socket, name):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


async def send_fd(sock: socket.socket, fd: int, data: bytes) -> None:
    """Pass a file descriptor over a Unix socket (SCM_RIGHTS) with a few bytes of data."""
    while True:
        try:
            sent = socket.send_fds(sock, [data], [fd])
            if sent < len(data):
                await send_all(sock, [data[sent:]])
            return
        except (BlockingIOError, InterruptedError):
            await _ready(sock, write=True)


async def recv_fd(sock: socket.socket, nbytes: int) -> tuple[int, bytes]:
    """Receive one file descriptor passed with :func:`send_fd`, and its ``nbytes`` of
    data."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, nbytes, 1)
        except (BlockingIOError, InterruptedError):
            await _ready(sock, write=False)
            continue
        if not data or not fds:
            for fd in fds:
                os.close(fd)
            raise PeerClosed("no file descriptor came with the hand-over")
        for fd in fds[1:]:
            os.close(fd)
        try:
            rest = await recv_exactly(sock, nbytes - len(data)) if len(data) < nbytes else b""
        except BaseException:
            os.close(fds[0])
            raise
        return fds[0], data + rest


async def connect_handshake(sock: socket.socket, secret: bytes, role: wire.Role, src: int,
                            dst: int, timeout: float, incarnation: int = 0) -> None:
    """Run the connector's side of the handshake on a connected socket. RendezvousError
    if the acceptor refuses; ProtocolError if it does not prove it knows the secret (or,
    on a Unix socket, runs as another user): nothing has been sent to it but the hello."""
    check_peer_uid(sock)
    answer = os.urandom(16)
    async with asyncio.timeout(timeout):
        _, nonce = wire.decode_challenge(await recv_exactly(sock, wire.CHALLENGE_SIZE))
        await send_all(sock, [wire.encode_hello(secret, nonce, role, src, dst, answer,
                                                     incarnation)])
        status = wire.decode_ack(await recv_exactly(sock, wire.ACK_SIZE), secret, nonce,
                                 answer)
    if status != wire.AckStatus.OK:
        raise RendezvousError(f"connection to {dst} refused: {status.name}")


async def _try_send(sock: socket.socket, data: bytes) -> None:
    try:
        await send_all(sock, [data])
    except OSError:
        pass


async def _ready(sock: socket.socket, write: bool) -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if write else \
        (loop.add_reader, loop.remove_reader)
    add(sock, lambda: fut.done() or fut.set_result(None))
    try:
        await fut
    finally:
        remove(sock)
