"""Ranks of one event loop joined in memory: the engine's transport without a socket.

A :class:`MemoryNetwork` joins the engines of several ranks running in one event loop,
so that schedules, header checks, mismatches and lost peers can be tried without a
socket, a rendezvous or a process. A frame goes through the same framing and routing
into the receiver's mailbox as one read off a socket
(:class:`~minidist.transport.reader.FrameSink`), cut into pieces of ``chunk`` bytes if
asked, as a stream may cut it::

    net = MemoryNetwork()
    engines = [Engine(r, Mailbox()) for r in range(2)]
    for e in engines:
        e.attach(net.join(e.rank, e.mailbox, e.connection_lost),
                 net.control(e.rank, e.abort_received))

:class:`MemoryControl` stands in for the rendezvous between them as far as a failed
call needs it: it forwards a rank's aborts to the ranks they name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from .. import messages
from ..errors import PeerLostError
from .mailbox import Mailbox
from .reader import FrameSink


class MemoryNetwork:
    """The ranks of one loop, by global rank; ``chunk`` (bytes, 0: whole) is how finely
    every frame is cut on its way."""

    def __init__(self, chunk: int = 0) -> None:
        self.chunk = chunk
        self.endpoints: dict[int, MemoryEndpoint] = {}
        self.controls: dict[int, MemoryControl] = {}

    def join(self, rank: int, mailbox: Mailbox,
             on_lost: Callable[[int, str], None] = lambda rank, reason: None
             ) -> MemoryEndpoint:
        """Rank ``rank``'s end, whose frames arrive in ``mailbox``; ``on_lost(rank,
        reason)`` when a peer closes its end (the engine's ``connection_lost``)."""
        end = MemoryEndpoint(self, rank, mailbox, on_lost)
        self.endpoints[rank] = end
        return end

    def control(self, rank: int,
                on_abort: Callable[[messages.Abort], None]) -> MemoryControl:
        """Rank ``rank``'s control plane; ``on_abort(abort)`` when another rank's call
        failed (the engine's ``abort_received``)."""
        control = MemoryControl(self, rank, on_abort)
        self.controls[rank] = control
        return control


class MemoryEndpoint:
    """One rank's end of a :class:`MemoryNetwork`: what the engine needs of an
    :class:`~minidist.transport.endpoint.Endpoint` (``send``, ``connected``,
    ``has_connection``, ``forbid``)."""

    def __init__(self, network: MemoryNetwork, rank: int, mailbox: Mailbox,
                 on_lost: Callable[[int, str], None]) -> None:
        self.network = network
        self.rank = rank
        self.mailbox = mailbox
        self.on_lost = on_lost
        self.closed = False
        self._streams: dict[int, FrameSink] = {}  # by sender: its stream's framing state
        self._gone: dict[int, Exception] = {}

    async def send(self, dst: int, header: bytes, payload: memoryview | None) -> None:
        """Send one frame to global rank ``dst``: in its mailbox (or its receive's
        array) when this returns. PeerLostError if ``dst`` is gone, closed or unknown."""
        if dst == self.rank:
            raise ValueError("a rank cannot connect to itself")
        peer = self.network.endpoints.get(dst)
        gone = self._gone.get(dst) or self.mailbox.is_dead(dst)
        if gone is not None:
            raise gone
        if peer is None or peer.closed or self.closed:
            raise PeerLostError(f"rank {dst} was lost: no open end in memory", ranks=[dst])
        peer.receive(self.rank, memoryview(header))
        if payload is not None:
            peer.receive(self.rank, payload)
        await asyncio.sleep(0)  # a write may let the loop run, as a socket's does

    def receive(self, src: int, data: memoryview) -> None:
        """Bytes of the stream from ``src``, in order."""
        stream = self._streams.get(src)
        if stream is None:
            stream = self._streams[src] = FrameSink(src, self.mailbox)
        chunk = self.network.chunk or data.nbytes or 1
        for at in range(0, data.nbytes, chunk):
            stream.feed(data[at:at + chunk])

    def connected(self, dst: int) -> None:
        """No frame is written from the caller's thread here: always None."""
        return None

    def has_connection(self, rank: int) -> bool:
        """True while this end and ``rank``'s are open."""
        peer = self.network.endpoints.get(rank)
        return peer is not None and not peer.closed and not self.closed

    def forbid(self, rank: int, exc: Exception) -> None:
        """``rank`` is gone: a frame to it raises ``exc`` from now on."""
        self._gone.setdefault(rank, exc)

    def close(self) -> None:
        """Close this end: every other open end hears that its stream from this rank
        ended (as when a socket closes)."""
        if self.closed:
            return
        self.closed = True
        for peer in list(self.network.endpoints.values()):
            if peer is not self and not peer.closed:
                peer.on_lost(self.rank, "connection closed by peer")


class MemoryControl:
    """The control plane of one rank of a :class:`MemoryNetwork` (the engine's
    ``Control``): a rank's abort reaches the other ranks it names on the loop's next
    turn, as the rendezvous forwards it; other notices are dropped, and a question gets
    no answer (TimeoutError)."""

    def __init__(self, network: MemoryNetwork, rank: int,
                 on_abort: Callable[[messages.Abort], None]) -> None:
        self.network = network
        self.rank = rank
        self.on_abort = on_abort

    def notify(self, msg: messages.Message) -> None:
        """Tell the other ranks: an abort goes to those it names, from this rank."""
        if not isinstance(msg, messages.Abort):
            return
        fwd = replace(msg, ranks=None, by=self.rank)
        loop = asyncio.get_running_loop()
        for r in msg.ranks or ():
            peer = self.network.controls.get(r)
            if peer is not None and r != self.rank:
                loop.call_soon(peer.on_abort, fwd)

    async def request(self, msg: messages.Message, blob: bytes = b"",
                      timeout: float = 300.0) -> messages.Reply:
        """No rendezvous answers here."""
        raise TimeoutError(f"no rendezvous in memory to answer {type(msg).__name__}")
