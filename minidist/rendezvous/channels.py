"""The rendezvous' view of one rank's connection: where its messages go, and what the
rendezvous knows of the rank."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .. import messages
from .control import write_control


class Channel:
    """Where a client's messages go: its own stream, or its node agent's stream with the
    client's id attached (``to``)."""

    def __init__(self, writer: asyncio.StreamWriter, cid: int | None = None) -> None:
        self.writer = writer
        self.cid = cid

    def send(self, msg: messages.Message) -> None:
        if self.writer.is_closing():
            return
        if self.cid is None:
            write_control(self.writer, msg)
        else:
            write_control(self.writer, msg, to=self.cid)

    def send_raw(self, raw: bytes, msg: messages.Message) -> None:
        """Send ``msg``, whose bytes ``raw`` were encoded once for many ranks (they fit
        only a rank's own stream)."""
        if self.cid is not None:
            self.send(msg)
        elif not self.writer.is_closing():
            self.writer.write(raw)

    async def drain(self) -> None:
        await self.writer.drain()

    def closing(self) -> bool:
        return self.writer.is_closing()

    def close(self) -> None:
        if self.cid is None:
            self.writer.close()


@dataclass
class Client:
    """One rank's connection to the rendezvous."""

    channel: Channel
    rank: int = -1
    node: str = ""
    pid: int = 0
    reads: str | None = None  # what a peer must share to read its memory (peer_memory)
    registered: bool = False
    said_bye: bool = False
    queries: dict[int, asyncio.Future] = field(default_factory=dict)

    def send(self, msg: messages.Message) -> None:
        self.channel.send(msg)
