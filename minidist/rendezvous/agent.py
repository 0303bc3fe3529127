"""The node agent of a node other than the rendezvous' own: the node's one TCP port.

It relays the control messages of its node's ranks (Unix sockets) to the rendezvous
over a single TCP connection, hands incoming TCP connections from other nodes to the
rank they are for (and leaves the data path), and exchanges heartbeats with the
rendezvous so that a vanished host is noticed in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket

from .. import fdlimits, messages, wire
from ..env import advertise_addr
from ..errors import DistTimeoutError, ProtocolError, RendezvousError
from ..transport import addresses
from ..transport.acceptor import HANDSHAKE_TIMEOUT, Acceptor
from ..transport.sockets import PeerClosed, connect_handshake, tune_tcp
from .client import node_identity
from .control import ControlReader, write_control
from .listeners import HEARTBEAT, HEARTBEAT_TIMEOUT, bind_listeners

log = logging.getLogger("minidist.agent")
# the rendezvous' messages for the agent itself, not relayed (heartbeats only: the agent
# notes that the rendezvous is alive whatever it hears from it)
_FOR_THE_AGENT = frozenset({messages.Heartbeat.TYPE})


class NodeAgent(Acceptor):
    """Serves one node of a job whose rendezvous runs at ``master``."""

    def __init__(self, secret: bytes, master_addr: str, master_port: int,
                 host: str = "0.0.0.0", port: int = 0) -> None:
        self.secret = secret
        self.job = addresses.job_key(secret)
        self.master = (master_addr, master_port)
        self.host = host
        self.port = port
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task] = set()
        self._local: dict[int, asyncio.StreamWriter] = {}
        self._ids = itertools.count(1)
        self._up: asyncio.StreamWriter | None = None
        self._closed = False
        self.lost_master: str | None = None

    async def start(self, listeners: list[socket.socket] | None = None,
                    timeout: float = 60.0) -> int:
        """Listen on the node's port, connect to the rendezvous; return the port."""
        fdlimits.raise_soft_limit()  # it holds a connection per rank of its node
        if listeners is None:
            listeners = bind_listeners(self.host, self.port, self.job)
        self._listeners = list(listeners)
        for s in self._listeners:
            s.setblocking(False)
            if s.family != socket.AF_UNIX:
                self.port = s.getsockname()[1]
        reader, self._up = await self._connect_master(timeout)
        host = advertise_addr(os.environ) or \
            self._up.get_extra_info("sockname")[0]
        write_control(self._up, messages.AgentHello(node=node_identity(), host=host,
                                                    port=self.port))
        for s in self._listeners:
            self._spawn(self._accept_loop(s))
        self._spawn(self._from_master(ControlReader(reader)))
        self._spawn(self._heartbeats())
        return self.port

    async def wait_all_left(self, timeout: float) -> None:
        """Return once no rank of this node is connected any more, or after ``timeout``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self._local and loop.time() < end and self.lost_master is None:
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        self._closed = True
        for s in self._listeners:
            s.close()
        for w in list(self._local.values()):
            w.close()
        if self._up is not None:
            self._up.close()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ upstream

    async def _connect_master(self, timeout: float):
        loop = asyncio.get_running_loop()
        last: Exception | None = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sock.setblocking(False)
                    tune_tcp(sock)
                    try:
                        await loop.sock_connect(sock, self.master)
                        await connect_handshake(sock, self.secret, wire.Role.AGENT, -1, -1,
                                                HANDSHAKE_TIMEOUT)
                        return await asyncio.open_connection(sock=sock)
                    except RendezvousError:
                        sock.close()
                        raise
                    except (OSError, PeerClosed, ProtocolError) as e:
                        sock.close()
                        last = e
                        await asyncio.sleep(0.1)
        except TimeoutError:
            raise DistTimeoutError(
                f"the node agent could not reach the rendezvous at {self.master[0]}:"
                f"{self.master[1]} within {timeout:g} s ({last})") from None

    async def _from_master(self, reader: ControlReader) -> None:
        """Relay the rendezvous' messages to this node's ranks (the agent's own, by
        :data:`_FOR_THE_AGENT`, stay here)."""
        loop = asyncio.get_running_loop()
        self._heard = loop.time()
        reason = "the rendezvous closed its connection"
        try:
            while True:
                msg = await reader.read()
                self._heard = loop.time()
                if msg.type in _FOR_THE_AGENT:
                    continue
                cid, msg = messages.unroute(msg, "to")
                w = self._local.get(cid)
                if w is not None and not w.is_closing():
                    write_control(w, msg)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except ProtocolError as e:
            reason = f"protocol error from the rendezvous: {e}"
        if not self._closed:
            self.lost_master = reason
            (log.error if self._local else log.info)("node agent lost the rendezvous: %s",
                                                     reason)
            for w in list(self._local.values()):  # its ranks learn it from their sockets
                w.close()

    async def _heartbeats(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(HEARTBEAT)
            if self._up is None or self._up.is_closing():
                return
            if loop.time() - getattr(self, "_heard", loop.time()) > HEARTBEAT_TIMEOUT:
                self._up.transport.abort()
                return
            write_control(self._up, messages.Heartbeat())

    # ------------------------------------------------------------------ local side

    async def _session(self, sock: socket.socket) -> None:
        tcp = sock.family != socket.AF_UNIX
        # TCP brings ranks of other nodes; the Unix socket, this node's ranks
        if await self._greet(sock, (wire.Role.PEER,) if tcp else (wire.Role.PROCESS,),
                             "node agent") is None:
            return
        reader, writer = await asyncio.open_connection(sock=sock)
        cid = next(self._ids)
        self._local[cid] = writer
        stream = ControlReader(reader)
        try:
            while True:
                msg = await stream.read()
                if self._up is None or self._up.is_closing():
                    break
                write_control(self._up, msg, via=cid)
                await self._up.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ProtocolError):
            pass
        finally:
            self._local.pop(cid, None)
            writer.close()
            if self._up is not None and not self._up.is_closing():
                with contextlib.suppress(Exception):
                    write_control(self._up, messages.Gone(via=cid))
