"""wire.FrameDecoder: the data-frame framing without a socket, fed byte by byte, in
random pieces, and with garbage."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import wire
from minidist.errors import ProtocolError

PEER = 3


def frame(seq: int, payload: bytes, src: int = PEER) -> bytes:
    h = wire.Header(wire.Kind.P2P, 0, 0, 0, 1, seq, src, -1, 0, 0, len(payload),
                    len(payload))
    return wire.encode_header(h) + payload


def run(stream: bytes, pieces: list[int], drop: set[int], stage: int = 256):
    """Feed ``stream`` in pieces of the given sizes (cycled); drop the payloads of the
    frames whose seq is in ``drop``. Returns [(seq, payload)] in delivery order, and the
    largest number of bytes any one buffer() took."""
    dec = wire.FrameDecoder(PEER, stage)
    at, k, out, dests, biggest = 0, 0, [], {}, 0
    while True:
        ev = dec.next_event()
        if ev is wire.NEED_DATA:
            if at == len(stream):
                return out, biggest, dec
            buf = dec.buffer()
            assert len(buf) >= 1
            n = min(len(buf), pieces[k % len(pieces)], len(stream) - at)
            k += 1
            buf[:n] = stream[at:at + n]
            at += n
            biggest = max(biggest, n)
            dec.received(n)
        elif isinstance(ev, wire.FrameEnd):
            out.append((ev.header.seq, bytes(dests.pop(ev.token))))
        else:
            assert isinstance(ev, wire.Header)
            if ev.seq in drop:
                assert dec.deliver_to(None) is None
                continue
            dest = np.full(ev.nbytes, 0xEE, np.uint8)
            dests[ev.seq] = dest
            done = dec.deliver_to(memoryview(dest), ev.seq)
            if done is not None:
                assert done.header == ev and done.token == ev.seq
                out.append((ev.seq, bytes(dests.pop(ev.seq))))


def payloads(rng: random.Random, n: int) -> list[bytes]:
    sizes = [0, 1, 63, 64, 65, 200, 255, 256, 257, 1000, 5000]
    return [bytes(rng.getrandbits(8) for _ in range(rng.choice(sizes))) for _ in range(n)]


@pytest.mark.parametrize("piece", [1, 7, 64, 100, 1 << 20])
def test_frames_arrive_whole_in_order_whatever_the_pieces(piece):
    rng = random.Random(piece)
    ps = payloads(rng, 30)
    stream = b"".join(frame(i, p) for i, p in enumerate(ps))
    out, _, _ = run(stream, [piece], drop=set())
    assert out == list(enumerate(ps))


def test_dropped_payloads_are_skipped_and_the_rest_is_intact():
    rng = random.Random(1)
    ps = payloads(rng, 40)
    stream = b"".join(frame(i, p) for i, p in enumerate(ps))
    drop = {i for i in range(40) if i % 3 == 0}
    out, _, _ = run(stream, [1, 5, 300, 2], drop)
    assert out == [(i, p) for i, p in enumerate(ps) if i not in drop]


def test_a_large_payload_goes_straight_to_its_destination():
    big = bytes(range(256)) * 40  # 10 KiB through a 256-byte staging buffer
    out, biggest, _ = run(frame(0, big), [1 << 20], drop=set())
    assert out == [(0, big)]
    assert biggest > 256  # read into the destination, not through the stage


def test_a_frame_claiming_another_sender_is_refused():
    dec = wire.FrameDecoder(PEER)
    data = frame(0, b"x", src=PEER + 1)
    dec.buffer()[:len(data)] = data
    dec.received(len(data))
    with pytest.raises(ProtocolError, match="claims src"):
        dec.next_event()


def test_garbage_is_a_protocol_error():
    dec = wire.FrameDecoder(PEER)
    junk = b"GET / HTTP/1.1\r\n" * 8
    dec.buffer()[:len(junk)] = junk
    dec.received(len(junk))
    with pytest.raises(ProtocolError):
        dec.next_event()


def test_misuse_is_an_error_not_a_silent_desync():
    dec = wire.FrameDecoder(PEER)
    data = frame(0, b"abc")
    dec.buffer()[:len(data)] = data
    dec.received(len(data))
    h = dec.next_event()
    with pytest.raises(RuntimeError):
        dec.next_event()  # the header was not answered
    with pytest.raises(ValueError):
        dec.deliver_to(memoryview(bytearray(2)))  # wrong size
    with pytest.raises(RuntimeError):
        dec.deliver_to(None)  # nothing awaits an answer any more
    assert h.nbytes == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=600), max_size=12),
       st.lists(st.integers(1, 700), min_size=1, max_size=8),
       st.sets(st.integers(0, 11)))
def test_fuzz_any_split_any_drop(ps, pieces, drop):
    stream = b"".join(frame(i, p) for i, p in enumerate(ps))
    out, _, _ = run(stream, pieces, drop)
    assert out == [(i, p) for i, p in enumerate(ps) if i not in drop]


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=64, max_size=400), st.lists(st.integers(1, 100), min_size=1))
def test_fuzz_random_bytes_never_crash_otherwise(junk, pieces):
    try:
        run(junk, pieces, set())
    except ProtocolError:
        pass


@pytest.mark.parametrize("piece", [100, 5000, 1 << 20])
def test_the_staging_buffer_starts_small_and_grows_only_while_reads_fill_it(piece):
    rng = random.Random(piece)
    quiet = frame(0, b"x" * 100)
    out, _, dec = run(quiet, [1 << 20], drop=set(), stage=1 << 16)
    assert out == [(0, b"x" * 100)] and len(dec._stage) == wire.FIRST_STAGE
    ps = [bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 10, 200, 1000])))
          for _ in range(400)]
    stream = b"".join(frame(i, p) for i, p in enumerate(ps))
    out, biggest, dec = run(stream, [piece], drop=set(), stage=1 << 16)
    assert out == list(enumerate(ps))
    assert len(dec._stage) <= 1 << 16
    if piece > wire.FIRST_STAGE:  # reads that filled the buffer made it grow
        assert len(dec._stage) > wire.FIRST_STAGE and biggest > wire.FIRST_STAGE
