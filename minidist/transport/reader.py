"""Reading frames off one connection, driven by the event loop's readiness callback.

Small frames are read many at a time into a staging buffer and copied to where they
belong; the payload of a large frame is read straight into the receiver's array (or a
fresh buffer when its receive is not posted yet). No task or future per read.
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


class FrameReader:
    """Parses the frames arriving on ``sock`` from rank ``peer`` into ``mailbox``;
    calls ``on_close(reason)`` once when the stream ends or breaks."""

    def __init__(self, sock: socket.socket, peer: int, mailbox: Mailbox,
                 on_close: Callable[[str], None]) -> None:
        self.sock = sock
        self.peer = peer
        self.mailbox = mailbox
        self.on_close = on_close
        self.stage = bytearray(STAGE)
        self.view = memoryview(self.stage)
        self.start = 0
        self.end = 0
        # a payload being read straight into its destination
        self.dest: memoryview | None = None
        self.done = 0
        self.pending: tuple[wire.Header, Posted | None, np.ndarray | None] | None = None
        self.discarding = 0
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
        try:
            while not self.closed:
                if self.discarding:
                    n = recv_into(self.view[:min(self.discarding, STAGE)])
                    if n == 0:
                        return self._fail("connection closed by peer")
                    self.discarding -= n
                    continue
                if self.dest is not None:
                    n = recv_into(self.dest[self.done:])
                    if n == 0:
                        return self._fail("connection closed by peer")
                    self.done += n
                    if self.done == self.dest.nbytes:
                        self._finish_payload()
                    continue
                if self.start and self.end == STAGE:
                    self._compact()
                n = recv_into(self.view[self.end:])
                if n == 0:
                    return self._fail("connection closed by peer")
                self.end += n
                self._parse()
        except (BlockingIOError, InterruptedError):
            return
        except ProtocolError as e:
            return self._fail(f"protocol error: {e}")
        except OSError as e:
            return self._fail(str(e) or type(e).__name__)

    def _compact(self) -> None:
        left = self.end - self.start
        self.stage[:left] = self.stage[self.start:self.end]
        self.start, self.end = 0, left

    def _parse(self) -> None:
        while self.end - self.start >= wire.HEADER_SIZE:
            h = wire.decode_header(self.view[self.start:self.start + wire.HEADER_SIZE])
            if h.src != self.peer:
                raise ProtocolError(f"frame claims src {h.src} on a connection from rank "
                                    f"{self.peer}")
            body = self.start + wire.HEADER_SIZE
            have = min(self.end - body, h.nbytes)
            posted = self.mailbox.claim(h)
            if posted is REJECTED:
                posted, dest, keep = None, None, None  # refused by the receive's check
            elif posted is not None and posted.view is not None:
                dest, keep = posted.view, None
            else:  # not asked for yet, or of any size: keep the bytes (not zero-filled)
                keep = np.empty(h.nbytes, np.uint8)
                dest = memoryview(keep)
            if dest is None:
                self.start = body + have
                self.discarding = h.nbytes - have
                if self.discarding:
                    self.start = self.end = 0
                    return
                continue
            dest[:have] = self.view[body:body + have]
            if have < h.nbytes:  # the rest goes straight to its destination
                self.dest, self.done = dest, have
                self.pending = (h, posted, keep)
                self.start = self.end = 0
                return
            self.start = body + have
            self._deliver(h, posted, keep)
        if self.start == self.end:
            self.start = self.end = 0

    def _finish_payload(self) -> None:
        h, posted, keep = self.pending
        self.dest, self.pending, self.done = None, None, 0
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
