"""Reading frames off one connection, driven by the event loop's readiness callback.

The framing itself (staging, payloads read straight into the receiver's array, dropped
payloads) is :class:`minidist.wire.FrameDecoder`'s; this module only moves bytes from
the socket into the buffers it names (:class:`FrameReader`) and hands each frame to the
mailbox (:class:`FrameSink`, which a stream without a socket feeds too:
:mod:`minidist.transport.memory`). No task or future per read.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import numpy as np

from .. import wire
from ..errors import ProtocolError
from .mailbox import REJECTED, Mailbox, Posted

STAGE = 1 << 16


class FrameSink:
    """Hands the frames of one stream from rank ``peer`` to ``mailbox``, each payload
    straight into the receive posted for it. :meth:`feed` takes the stream's bytes as
    they come; :class:`FrameReader` reads them off a socket instead."""

    def __init__(self, peer: int, mailbox: Mailbox) -> None:
        self.peer = peer
        self.mailbox = mailbox
        self.decoder = wire.FrameDecoder(peer, STAGE)

    def feed(self, data: memoryview) -> None:
        """The next bytes of the stream (any cut: a frame may end in a later feed).
        ProtocolError for bytes that are not a frame from ``peer``."""
        dec = self.decoder
        need, frame_end = wire.NEED_DATA, wire.FrameEnd
        at, end = 0, data.nbytes
        while True:
            ev = dec.next_event()
            if ev is need:
                if at == end:
                    return
                into = dec.buffer()
                n = min(into.nbytes, end - at)
                into[:n] = data[at:at + n]
                at += n
                dec.received(n)
            elif type(ev) is frame_end:
                self._deliver(ev.header, *ev.token)
            else:
                self._begin(dec, ev)

    def _begin(self, dec: wire.FrameDecoder, h: wire.Header) -> None:
        """A frame begins: its payload goes to the receive posted for it, into a fresh
        buffer (not asked for yet), or nowhere (refused by the receive's check)."""
        posted = self.mailbox.claim(h)
        if posted is REJECTED:
            dec.deliver_to(None)
            return
        if posted is not None and posted.view is not None:
            dest, keep = posted.view, None
        else:  # not asked for yet, or of any size: keep the bytes (not zero-filled)
            keep = np.empty(h.nbytes, np.uint8)
            dest = memoryview(keep)
        if dec.deliver_to(dest, (posted, keep)) is not None:
            self._deliver(h, posted, keep)

    def _deliver(self, h: wire.Header, posted: Posted | None, keep: np.ndarray | None) -> None:
        if posted is None:
            self.mailbox.deposit(h, keep)
        elif posted.future.done():
            return
        elif posted.view is None:
            posted.future.set_result((h, bytes(keep)))
        else:
            posted.future.set_result(h)


class FrameReader(FrameSink):
    """Reads the frames arriving on ``sock`` from rank ``peer`` into ``mailbox``; calls
    ``on_close(reason)`` once when the stream ends or breaks."""

    def __init__(self, sock: socket.socket, peer: int, mailbox: Mailbox,
                 on_close: Callable[[str], None]) -> None:
        super().__init__(peer, mailbox)
        self.sock = sock
        self.on_close = on_close
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self.loop.add_reader(sock.fileno(), self._readable)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.loop.remove_reader(self.sock.fileno())
            except (ValueError, OSError):
                pass

    def _fail(self, reason: str) -> None:
        if not self.closed:
            self.close()
            self.on_close(reason)

    def _readable(self) -> None:
        recv_into = self.sock.recv_into
        dec = self.decoder
        need, frame_end = wire.NEED_DATA, wire.FrameEnd
        try:
            while not self.closed:
                ev = dec.next_event()
                if ev is need:
                    n = recv_into(dec.buffer())
                    if n == 0:
                        return self._fail("connection closed by peer")
                    dec.received(n)
                elif type(ev) is frame_end:
                    self._deliver(ev.header, *ev.token)
                else:
                    self._begin(dec, ev)
        except (BlockingIOError, InterruptedError):
            return
        except ProtocolError as e:
            return self._fail(f"protocol error: {e}")
        except OSError as e:
            return self._fail(str(e) or type(e).__name__)
