"""Handing an authenticated TCP connection from a node's agent to the rank it is for.

A rank on another node reaches rank ``d`` by connecting to ``d``'s node agent (the
node's one TCP port). The agent checks the connector's hello, then passes the socket
itself to ``d`` over ``d``'s Unix socket (SCM_RIGHTS) and forgets it: the agent is never
on the data path. Rank ``d`` answers the connector's hello with the ack.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from .. import wire
from ..errors import ProtocolError, RendezvousError
from . import addresses
from .sockets import connect_handshake, nonblocking_unix_socket, send_all, send_fd


async def hand_over(sock: socket.socket, hello: wire.Hello, nonce: bytes, job: str,
                    secret: bytes, timeout: float) -> None:
    """Give ``sock`` (whose hello, answering challenge ``nonce``, is verified) to local
    rank ``hello.dst``, with both nonces so that the rank can sign the ack; on failure
    tell the connector and close. The agent's copy of the socket is closed either way."""
    loop = asyncio.get_running_loop()
    unix = nonblocking_unix_socket()
    try:
        async with asyncio.timeout(timeout):
            await loop.sock_connect(unix, addresses.peer_address(job, hello.dst))
            await connect_handshake(unix, secret, wire.Role.AGENT, hello.src, hello.dst,
                                    timeout, hello.incarnation)
            await send_fd(unix, sock.fileno(), nonce + hello.nonce)
    except (OSError, TimeoutError, ProtocolError, RendezvousError) as e:
        with contextlib.suppress(OSError):
            await send_all(sock, [wire.encode_ack(wire.AckStatus.WRONG_DESTINATION)])
        raise ConnectionError(f"cannot hand a connection to rank {hello.dst}: {e}") from e
    finally:
        unix.close()
        sock.close()
