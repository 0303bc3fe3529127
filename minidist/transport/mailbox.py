"""Matching incoming data frames to the receives a rank has posted.

A frame is identified by its key ``(src, group, seq, tag, p2p)``. If a receive with that
key is posted, the payload is read straight into the receiver's buffer (zero-copy);
otherwise it is read into a fresh buffer and kept until the receive is posted. A posted
receive checks the header first, so a mismatched frame never touches the buffer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import CollectiveMismatchError
from ..wire import Header, Kind

Key = tuple[int, int, int, int, bool]
Check = Callable[[Header], Exception | None]


def frame_key(h: Header) -> Key:
    return (h.src, h.group, h.seq, h.tag, h.kind == Kind.P2P)


@dataclass(slots=True)
class Posted:
    """A receive waiting for its frame."""

    key: Key
    view: memoryview | None  # where the payload goes; None: any size, kept as bytes
    check: Check  # returns the error to raise for a header that does not fit, or None
    future: asyncio.Future = field(repr=False)


@dataclass(slots=True)
class AnyPosted:
    """A receive from any sender of (group, tag): it takes the first frame to arrive
    whose number is the next one expected from its sender."""

    group: int
    tag: int
    view: memoryview | None
    check: Check
    future: asyncio.Future = field(repr=False)
    expected: Callable[[int], int]  # sender -> the number of its next message
    taken: Callable[[int], None]  # a message of this sender was received


REJECTED = Posted((0, 0, 0, 0, False), None, lambda h: None, None)
"""What :meth:`Mailbox.claim` returns for a frame whose receive refused it: the reader
reads its payload and drops it."""


class Mailbox:
    """Posted receives and early (unexpected) frames of one process."""

    def __init__(self) -> None:
        self._posted: dict[Key, Posted] = {}
        self._early: dict[Key, tuple[Header, bytearray]] = {}
        self._dead: dict[int, Exception] = {}  # src rank -> why nothing more will come
        # (group, seq) of running collectives -> a check of any frame's header
        self._expect: dict[tuple[int, int], Check] = {}
        self.on_mismatch: Callable[[int, int, Exception], None] = lambda g, s, e: None
        self._any: dict[tuple[int, int], list[AnyPosted]] = {}  # (group, tag) -> receives
        self._arrivals: list[asyncio.Future] = []  # probes waiting for a message to arrive
        # a collective's frame that nobody expects: True to drop it (its call is over)
        self.on_unexpected: Callable[[Header], bool] = lambda h: False
        # point-to-point frames with this tag are signals to this rank, not messages
        self.signal_tag = -1
        self.on_signal: Callable[[int], None] = lambda src: None
        # a message was kept for a receive not posted here, or a sender is gone
        self.on_p2p_news: Callable[[], None] = lambda: None

    @property
    def early(self) -> dict[Key, tuple[Header, bytearray]]:
        """Frames that arrived before their receive (a receive on another thread may
        take its own with ``early.pop(key, None)``, atomic under the GIL)."""
        return self._early

    def p2p_waiting(self) -> bool:
        """Whether a point-to-point receive or probe waits here."""
        return bool(self._any or self._arrivals
                    or self._posted and any(k[4] for k in list(self._posted)))

    def expect(self, group: int, seq: int, check: Check) -> Exception | None:
        """Check every frame of collective (group, seq), also those whose receive is not
        posted yet; return the error of a frame that already arrived and does not fit."""
        self._expect[(group, seq)] = check
        for key, (header, _) in self._early.items():
            if key[1] == group and key[2] == seq and not key[4]:
                err = check(header)
                if err is not None:
                    return err
        return None

    def unexpect(self, group: int, seq: int) -> None:
        self._expect.pop((group, seq), None)

    def post(self, key: Key, view: memoryview | None, check: Check) -> asyncio.Future:
        """Ask for the frame ``key`` to land in ``view``; the future resolves to its header.

        With ``view`` None the frame may have any length and the future resolves to
        (header, payload bytes).
        """
        fut = asyncio.get_running_loop().create_future()
        early = self._early.pop(key, None)
        if early is not None:
            header, payload = early
            self._deliver(Posted(key, view, check, fut), header, payload)
        elif key[0] in self._dead:
            _fail(fut, self._dead[key[0]])
        else:
            if key in self._posted:
                raise RuntimeError(f"a receive for {key} is already posted")
            self._posted[key] = Posted(key, view, check, fut)
        return fut

    def post_any(self, group: int, tag: int, view: memoryview | None, check: Check,
                 expected: Callable[[int], int], taken: Callable[[int], None]
                 ) -> asyncio.Future:
        """Like :meth:`post`, for the next message of (group, tag) from any sender: the
        earliest one already here, else the first to arrive. Messages of one sender
        are still taken in their order."""
        fut = asyncio.get_running_loop().create_future()
        for key, (header, payload) in self._early.items():  # in order of arrival
            if key[4] and key[1] == group and key[3] == tag and key[2] == expected(key[0]):
                del self._early[key]
                taken(key[0])
                self._deliver(Posted(key, view, check, fut), header, payload)
                return fut
        self._any.setdefault((group, tag), []).append(
            AnyPosted(group, tag, view, check, fut, expected, taken))
        return fut

    def peek(self, group: int, tag: int, src: int | None,
             expected: Callable[[int], int]) -> Header | None:
        """The header of the message a receive from ``src`` (None: any sender) with
        ``tag`` would take now, if it has arrived whole; nothing is consumed."""
        for key, (header, _) in self._early.items():
            if key[4] and key[1] == group and key[3] == tag and \
                    (src is None or key[0] == src) and key[2] == expected(key[0]):
                return header
        return None

    def next_arrival(self) -> asyncio.Future:
        """A future done when the next message that no receive took arrives whole."""
        fut = asyncio.get_running_loop().create_future()
        self._arrivals.append(fut)
        return fut

    def cancel_any(self, fut: asyncio.Future) -> None:
        """Forget a receive from any sender (abandoned)."""
        for key, waiters in list(self._any.items()):
            self._any[key] = [w for w in waiters if w.future is not fut]
            if not self._any[key]:
                del self._any[key]
        if not fut.done():
            fut.cancel()

    def _any_for(self, header: Header) -> Posted | None:
        """The receive from any sender that an arriving message goes to, if one waits."""
        waiters = self._any.get((header.group, header.tag))
        if not waiters or header.kind != Kind.P2P or \
                header.seq != waiters[0].expected(header.src):
            return None
        w = waiters.pop(0)
        if not waiters:
            del self._any[(header.group, header.tag)]
        w.taken(header.src)
        return Posted(frame_key(header), w.view, w.check, w.future)

    def cancel(self, key: Key) -> None:
        """Forget a posted receive (its collective failed or was abandoned)."""
        p = self._posted.pop(key, None)
        if p is not None and not p.future.done():
            p.future.cancel()

    def claim(self, header: Header) -> Posted | None:
        """The posted receive for an arriving frame, removed from the table, or None.

        If the header does not fit the receive, the receive's future fails and
        :data:`REJECTED` is returned: the caller must read and drop the payload.
        """
        if header.tag == self.signal_tag and header.kind == Kind.P2P:
            self.on_signal(header.src)
            return REJECTED
        p = self._posted.pop(frame_key(header), None)
        if p is None and self._any:
            p = self._any_for(header)
        if p is None:
            return None
        err = p.check(header)
        if err is None and p.view is not None and header.nbytes != p.view.nbytes:
            err = CollectiveMismatchError(
                f"frame of {header.nbytes} bytes for a {p.view.nbytes}-byte receive")
        if err is not None:
            if not p.future.done():
                _fail(p.future, err)
            return REJECTED
        return p

    def deposit(self, header: Header, payload: bytearray) -> None:
        """Keep a frame that arrived before its receive was posted (or hand it over, if
        the receive was posted while the payload was being read)."""
        key = frame_key(header)
        posted = self._posted.pop(key, None)
        if posted is None and self._any and key[4]:
            posted = self._any_for(header)
        if posted is not None:
            self._deliver(posted, header, payload)
            return
        check = self._expect.get((key[1], key[2])) if not key[4] else None
        if check is None and not key[4] and self.on_unexpected(header):
            return
        self._early[key] = (header, payload)
        if key[4]:
            self.on_p2p_news()
        if key[4] and self._arrivals:
            arrivals, self._arrivals = self._arrivals, []
            for fut in arrivals:
                if not fut.done():
                    fut.set_result(None)
        if check is not None:
            err = check(header)
            if err is not None:
                self.on_mismatch(key[1], key[2], err)

    def peer_dead(self, src: int, exc: Exception) -> None:
        """Fail every receive from ``src``, now and later, with ``exc``."""
        self._dead[src] = exc
        self.on_p2p_news()
        for key in [k for k in self._posted if k[0] == src]:
            p = self._posted.pop(key)
            if not p.future.done():
                _fail(p.future, exc)

    def fail_group(self, group: int, seq: int | None, exc: Exception) -> None:
        """Fail the receives of one collective (or of every collective) of a group."""
        for key in [k for k in self._posted
                    if k[1] == group and (seq is None or k[2] == seq) and not k[4]]:
            p = self._posted.pop(key)
            if not p.future.done():
                _fail(p.future, exc)

    def drop_early(self, group: int, seq: int) -> list[Header]:
        """Forget frames of a collective that will never be received; return their
        headers."""
        keys = [k for k in self._early if k[1] == group and k[2] == seq and not k[4]]
        return [self._early.pop(k)[0] for k in keys]

    def is_dead(self, src: int) -> Exception | None:
        return self._dead.get(src)

    def revive(self, src: int) -> None:
        """``src`` is back as a new process: receives from it may wait again, and what
        its earlier incarnation sent and nobody took is forgotten."""
        self._dead.pop(src, None)
        for key in [k for k in self._early if k[0] == src]:
            del self._early[key]

    @staticmethod
    def _deliver(p: Posted, header: Header, payload: bytearray) -> None:
        if p.future.done():  # abandoned meanwhile
            return
        err = p.check(header)
        if err is None and p.view is not None and len(payload) != p.view.nbytes:
            err = CollectiveMismatchError(
                f"frame of {len(payload)} bytes for a {p.view.nbytes}-byte receive")
        if err is not None:
            _fail(p.future, err)
            return
        if p.view is None:
            p.future.set_result((header, bytes(payload)))
            return
        p.view[:] = payload
        p.future.set_result(header)


def _fail(fut: asyncio.Future, exc: BaseException) -> None:
    """Fail a receive's future. Its call may already have been ended another way (its
    task cancelled by the engine), so the error counts as seen: asyncio does not report
    it as lost."""
    fut.set_exception(exc)
    fut.exception()
