"""Frame matching in the mailbox, including the race between a frame's arrival and its receive."""

import pytest

from minidist import wire
from minidist.errors import CollectiveMismatchError, PeerLostError
from minidist.transport.mailbox import REJECTED, Mailbox, frame_key


def hdr(src=1, seq=0, tag=0, nbytes=4, dtype=10):
    return wire.Header(wire.Kind.ALL_REDUCE, dtype, 0, 0, 0, seq, src, -1, tag, 0, 1, nbytes)


def ok(h):
    return None


async def test_posted_receive_gets_frame():
    mb = Mailbox()
    buf = bytearray(4)
    fut = mb.post(frame_key(hdr()), memoryview(buf), ok)
    p = mb.claim(hdr())
    assert p is not None and p.view.nbytes == 4 and p.future is fut
    assert mb.claim(hdr()) is None  # claimed once


async def test_early_frame_is_kept_until_posted():
    mb = Mailbox()
    assert mb.claim(hdr()) is None
    mb.deposit(hdr(), bytearray(b"abcd"))
    buf = bytearray(4)
    fut = mb.post(frame_key(hdr()), memoryview(buf), ok)
    assert fut.done() and buf == b"abcd"


async def test_receive_posted_while_early_payload_is_read():
    # the reader claims (nothing posted), awaits the payload, the receive is posted
    # meanwhile, then the payload is deposited: it must reach the posted receive
    mb = Mailbox()
    assert mb.claim(hdr()) is None
    buf = bytearray(4)
    fut = mb.post(frame_key(hdr()), memoryview(buf), ok)
    assert not fut.done()
    mb.deposit(hdr(), bytearray(b"wxyz"))
    assert fut.done() and buf == b"wxyz"


async def test_mismatched_frame_leaves_buffer_untouched():
    mb = Mailbox()
    buf = bytearray(b"keep")

    def check(h):
        return CollectiveMismatchError("dtype") if h.dtype != 10 else None

    fut = mb.post(frame_key(hdr()), memoryview(buf), check)
    p = mb.claim(hdr(dtype=11))
    assert p is REJECTED  # the caller drops the payload
    with pytest.raises(CollectiveMismatchError):
        fut.result()
    assert buf == b"keep"
    # the same for a frame that arrived before the receive
    mb.deposit(hdr(seq=1, dtype=11), bytearray(b"zzzz"))
    fut = mb.post(frame_key(hdr(seq=1)), memoryview(buf), check)
    with pytest.raises(CollectiveMismatchError):
        fut.result()
    assert buf == b"keep"


async def test_wrong_length_is_a_mismatch():
    mb = Mailbox()
    fut = mb.post(frame_key(hdr()), memoryview(bytearray(4)), ok)
    mb.claim(hdr(nbytes=8))
    with pytest.raises(CollectiveMismatchError, match="8 bytes"):
        fut.result()


async def test_dead_peer_fails_now_and_later():
    mb = Mailbox()
    fut = mb.post(frame_key(hdr(src=2)), memoryview(bytearray(4)), ok)
    mb.peer_dead(2, PeerLostError("gone", ranks=[2]))
    with pytest.raises(PeerLostError):
        fut.result()
    later = mb.post(frame_key(hdr(src=2, seq=5)), memoryview(bytearray(4)), ok)
    with pytest.raises(PeerLostError):
        later.result()
    other = mb.post(frame_key(hdr(src=3)), memoryview(bytearray(4)), ok)
    assert not other.done()


async def test_expect_flags_unasked_frames():
    mb = Mailbox()
    seen = []
    mb.on_mismatch = lambda g, s, e: seen.append((g, s, str(e)))

    def check(h):
        return CollectiveMismatchError("kind") if h.kind != wire.Kind.ALL_REDUCE else None

    bad = wire.Header(wire.Kind.BROADCAST, 10, 0, 0, 0, 3, 1, 0, 9, 0, 1, 4)
    mb.deposit(bad, bytearray(4))
    assert mb.expect(0, 3, check) is not None  # already there: reported at start
    mb.deposit(wire.Header(wire.Kind.BROADCAST, 10, 0, 0, 0, 3, 2, 0, 9, 0, 1, 4), bytearray(4))
    assert seen and seen[0][:2] == (0, 3)
