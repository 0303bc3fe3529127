"""The rendezvous' side of its node agents: one connection per other node, relaying that
node's ranks, with heartbeats both ways so that a vanished host is noticed in seconds."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .. import messages, wire
from ..errors import ProtocolError
from .channels import Channel, Client
from .control import ControlReader
from .listeners import HEARTBEAT, HEARTBEAT_TIMEOUT

log = logging.getLogger("minidist.rendezvous")


@dataclass(eq=False)
class _Agent:
    """A node agent connected to this rendezvous, relaying its node's ranks."""

    writer: asyncio.StreamWriter
    sock: socket.socket
    node: str = ""
    host: str = ""
    port: int = 0
    last_heard: float = 0.0
    clients: dict[int, Client] = field(default_factory=dict)


class AgentLinks:
    """The node agents connected to the rendezvous. A relayed rank's messages go to
    ``handle(client, message)``; a rank whose connection closed, or whose node's agent
    was lost, to ``gone(client[, reason])``."""

    def __init__(self, handle: Callable[[Client, wire.Control], Awaitable[None]],
                 gone: Callable[..., None]) -> None:
        self._handle = handle
        self._gone = gone
        self._agents: set[_Agent] = set()
        # the agents' own messages, by type (every other message is a rank's, relayed)
        self._handlers: dict[str, Callable[[_Agent, Any], None]] = {
            messages.AgentHello.TYPE: self._hello,
            messages.Heartbeat.TYPE: lambda agent, m: None,  # heard: that is all
            messages.Gone.TYPE: self._client_gone}

    def where(self) -> dict[str, list]:
        """How ranks of other nodes reach each agent's node: node -> [host, port]."""
        return {a.node: [a.host, a.port] for a in self._agents}

    def close(self) -> None:
        for a in list(self._agents):
            a.writer.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    sock: socket.socket) -> None:
        """Serve every rank of another node through that node's agent, until the
        connection closes; then its ranks are gone."""
        loop = asyncio.get_running_loop()
        agent = _Agent(writer, sock, last_heard=loop.time())
        self._agents.add(agent)
        stream = ControlReader(reader)
        reason = "the connection to its node's agent closed"
        try:
            while True:
                control = await stream.read()
                agent.last_heard = loop.time()
                handler = self._handlers.get(control.type)
                if handler is not None:
                    handler(agent, messages.decode(control))
                else:
                    await self._relay(agent, control)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            if agent.last_heard + HEARTBEAT_TIMEOUT < loop.time():
                reason = (f"its node ({agent.host}) stopped answering for "
                          f"{HEARTBEAT_TIMEOUT:g} s")
        except ProtocolError as e:
            reason = f"protocol error from its node's agent: {e}"
            log.error("rendezvous: %s", reason)
        finally:
            writer.close()
            self._agents.discard(agent)
            for c in list(agent.clients.values()):
                self._gone(c, reason)

    async def heartbeats(self) -> None:
        """Tell each node agent we are alive; drop agents that went silent."""
        loop = asyncio.get_running_loop()
        beat = messages.Heartbeat().encode()
        while True:
            await asyncio.sleep(HEARTBEAT)
            for a in list(self._agents):
                if a.last_heard + HEARTBEAT_TIMEOUT < loop.time():
                    a.writer.transport.abort()
                elif not a.writer.is_closing():
                    a.writer.write(beat)

    def _hello(self, agent: _Agent, m: messages.AgentHello) -> None:
        agent.node, agent.port = str(m.node), int(m.port)
        agent.host = m.host or agent.sock.getpeername()[0]

    def _client_gone(self, agent: _Agent, m: messages.Gone) -> None:
        c = agent.clients.pop(m.via, None)
        if c is not None:
            self._gone(c)

    async def _relay(self, agent: _Agent, control: wire.Control) -> None:
        cid, control = messages.unroute(control, "via")
        if cid is None:
            raise ProtocolError(f"message {control.type!r} from a node agent names no "
                                "rank's connection")
        c = agent.clients.get(cid)
        if c is None:
            c = agent.clients[cid] = Client(Channel(agent.writer, cid))
        await self._handle(c, control)
