"""What every part of the engine shares: its constants, the control plane it
talks to, and the record of a call it runs (:class:`Active`)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..group import Group
from ..messages import Message, Reply
from ..plan import Call
from ..transport.endpoint import Connection
from ..transport.mailbox import Key

log = logging.getLogger("minidist.engine")

FLAG_OBJECT = 1  # a point-to-point frame that carries a pickled object
OBJECT_DTYPE = 255
INTERNAL_TAGS = 1 << 31  # point-to-point tags from here up are minidist's own

# seconds a broken connection (or a failed send) waits for the rendezvous to say why
# its peer is gone: left normally, died, or died because another rank died first
NEWS_GRACE = 2.0
FINISHED_KEPT = 4096  # collectives per rank whose outcome is remembered for late frames
# seconds a collective may wait before this rank tells the rendezvous what it called, so
# that ranks stuck in calls that disagree (roots, for one) find out without a frame
STALL_CHECK = 1.0
LEFT = "it called destroy() or its script ended"


class Control(Protocol):
    """What the engine needs from the job's control plane (the rendezvous client): tell
    the other ranks something, and ask a question with a deadline."""

    def notify(self, msg: Message) -> None: ...

    async def request(self, msg: Message, blob: bytes = b"",
                      timeout: float = 300.0) -> Reply: ...


class Transport(Protocol):
    """What the engine needs from the transport: this rank's
    :class:`~minidist.transport.endpoint.Endpoint` (sockets), or a
    :class:`~minidist.transport.memory.MemoryEndpoint` (ranks of one loop, in memory).
    Frames that arrive go to the engine's mailbox."""

    async def send(self, dst: int, header: bytes, payload: memoryview | None) -> None:
        """Send one frame to global rank ``dst``; PeerLostError if it cannot be reached."""

    def connected(self, dst: int) -> Connection | None:
        """The open connection a frame to ``dst`` may be written on from the caller's
        thread (:meth:`Connection.send_now`), if there is one."""

    def has_connection(self, rank: int) -> bool:
        """True while some connection with ``rank`` is open."""

    def forbid(self, rank: int, exc: Exception) -> None:
        """``rank`` is gone: never reach it again (``exc`` says why)."""


def tag_name(tag: int) -> str:
    """A point-to-point tag as users know it (minidist's own tags have no number)."""
    return f"tag {tag}" if tag < INTERNAL_TAGS else "an internal message"


@dataclass(eq=False)
class Active:
    """A call running on the loop: a collective (``call``) or one message to or from
    ``peer``."""

    group: Group
    call: Call | None = None
    peer: int = -1
    task: asyncio.Task | None = None
    keys: list[Key] = field(default_factory=list)
    error: BaseException | None = None
    quiet: bool = False  # its error came from another rank: do not tell the others again

    def needs(self, rank: int) -> bool:
        return rank in self.group if self.call is not None else rank == self.peer


def as_bytes(a: np.ndarray) -> memoryview:
    """A contiguous array's memory as bytes."""
    return memoryview(a).cast("B")
