"""The wire format, byte by byte."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import wire
from minidist.errors import ProtocolError


def header(**kw):
    base = dict(kind=wire.Kind.ALL_REDUCE, dtype=10, op=0, algorithm=1, group=0xDEADBEEF,
                seq=7, src=3, root=-1, tag=2, shape=12345, count=1000, nbytes=4000)
    base.update(kw)
    return wire.Header(**base)


def test_header_layout_is_fixed():
    raw = wire.encode_header(header())
    assert len(raw) == wire.HEADER_SIZE == 64
    assert raw[:2] == b"MD"
    assert raw[2] == wire.VERSION
    assert raw[3] == wire.Kind.ALL_REDUCE
    assert raw[4] == 10  # dtype
    assert struct.unpack_from("<Q", raw, 8)[0] == 0xDEADBEEF  # group
    assert struct.unpack_from("<Q", raw, 16)[0] == 7  # seq
    assert struct.unpack_from("<i", raw, 24)[0] == 3  # src
    assert struct.unpack_from("<i", raw, 28)[0] == -1  # root
    assert struct.unpack_from("<Q", raw, 40)[0] == 1000  # count
    assert struct.unpack_from("<Q", raw, 48)[0] == 4000  # nbytes


@given(kind=st.sampled_from(list(wire.Kind)), dtype=st.integers(0, 255),
       op=st.integers(0, 255), group=st.integers(0, 2**64 - 1), seq=st.integers(0, 2**64 - 1),
       src=st.integers(0, 2**31 - 1), root=st.integers(-1, 2**31 - 1),
       tag=st.integers(0, 2**32 - 1), count=st.integers(0, 2**64 - 1),
       nbytes=st.integers(0, 2**64 - 1))
@settings(max_examples=200, deadline=None)
def test_header_roundtrip(kind, dtype, op, group, seq, src, root, tag, count, nbytes):
    h = header(kind=kind, dtype=dtype, op=op, group=group, seq=seq, src=src, root=root,
               tag=tag, count=count, nbytes=nbytes)
    assert wire.decode_header(wire.encode_header(h)) == h


@given(dtype=st.integers(0, 255), flags=st.integers(0, 255),
       group=st.integers(0, 2**64 - 1), seq=st.integers(0, 2**64 - 1),
       src=st.integers(0, 2**31 - 1), tag=st.integers(0, 2**32 - 1),
       shape=st.integers(0, 2**32 - 1), count=st.integers(0, 2**64 - 1),
       nbytes=st.integers(0, 2**64 - 1))
@settings(max_examples=200, deadline=None)
def test_a_message_header_is_the_general_header_byte_for_byte(dtype, flags, group, seq, src,
                                                              tag, shape, count, nbytes):
    h = wire.Header(wire.Kind.P2P, dtype, 0, 0, group, seq, src, -1, tag, shape, count,
                    nbytes, flags)
    assert wire.encode_p2p(dtype, flags, group, seq, src, tag, shape, count, nbytes) == \
        wire.encode_header(h)


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b"XX" + b[2:], "magic"),
    (lambda b: b[:2] + bytes([99]) + b[3:], "version"),
    (lambda b: b[:3] + bytes([200]) + b[4:], "kind"),
    (lambda b: b[:63], "expected 64 bytes"),
])
def test_bad_headers_are_rejected(mutate, message):
    with pytest.raises(ProtocolError, match=message):
        wire.decode_header(mutate(wire.encode_header(header())))


@given(st.binary(min_size=64, max_size=64))
@settings(max_examples=300, deadline=None)
def test_random_bytes_never_crash_the_decoder(raw):
    try:
        wire.decode_header(raw)
    except ProtocolError:
        pass


def test_shape_digest_tells_shapes_apart():
    assert wire.shape_digest((2, 3)) != wire.shape_digest((3, 2))
    assert wire.shape_digest((6,)) != wire.shape_digest((2, 3))
    assert wire.shape_digest((2, 3)) == wire.shape_digest((2, 3))


def test_handshake_roundtrip_and_secret_check():
    nonce = bytes(range(16))
    answer = bytes(range(100, 116))
    ch = wire.encode_challenge(wire.Role.PEER, nonce)
    assert len(ch) == wire.CHALLENGE_SIZE
    assert wire.decode_challenge(ch) == (wire.Role.PEER, nonce)
    raw = wire.encode_hello(b"secret", nonce, wire.Role.PEER, 4, 5, answer)
    assert len(raw) == wire.HELLO_SIZE == 64
    hello = wire.decode_hello(raw)
    assert (hello.role, hello.src, hello.dst, hello.nonce) == (wire.Role.PEER, 4, 5, answer)
    assert hello.verify(b"secret", nonce)
    assert not hello.verify(b"other", nonce)
    assert not hello.verify(b"secret", bytes(16))
    # a hello re-addressed by a stranger, or with another nonce of its own, no longer verifies
    assert not wire.Hello(hello.role, hello.src, 6, answer, hello.mac).verify(b"secret", nonce)
    assert not wire.Hello(hello.role, 4, 5, bytes(16), hello.mac).verify(b"secret", nonce)


def test_handshake_ack_proves_the_acceptor_knows_the_secret():
    nonce, answer = bytes(range(16)), bytes(range(100, 116))
    ok = wire.encode_ack(wire.AckStatus.OK, b"secret", nonce, answer)
    assert len(ok) == wire.ACK_SIZE == 40
    assert ok[:8] == b"MDHS" + bytes([wire.VERSION, 0, 0, 0])
    assert ok[8:] == wire.ack_mac(b"secret", nonce, answer, wire.AckStatus.OK)
    assert wire.decode_ack(ok, b"secret", nonce, answer) == wire.AckStatus.OK
    # a squatter that does not know the secret cannot say OK
    for fake in (wire.encode_ack(wire.AckStatus.OK),
                 wire.encode_ack(wire.AckStatus.OK, b"guess", nonce, answer),
                 wire.encode_ack(wire.AckStatus.OK, b"secret", nonce, bytes(16)),  # replayed
                 ok[:8] + wire.hello_mac(b"secret", nonce, answer, wire.Role.PEER, 4, 5)):
        with pytest.raises(ProtocolError, match="does not know the job secret"):
            wire.decode_ack(fake, b"secret", nonce, answer)
    # a refusal carries no proof and needs none
    no = wire.encode_ack(wire.AckStatus.BAD_SECRET)
    assert wire.decode_ack(no, b"secret", nonce, answer) == wire.AckStatus.BAD_SECRET


def test_handshake_garbage_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        wire.decode_hello(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(36))
    with pytest.raises(ProtocolError):
        wire.decode_challenge(b"\x00" * wire.CHALLENGE_SIZE)
    with pytest.raises(ProtocolError):
        wire.decode_ack(b"MDHS" + bytes([wire.VERSION, 77, 0, 0]) + bytes(32))


def test_control_stream_decoder_handles_fragments():
    msgs = [({"t": "kv_set", "key": "a", "id": 1}, b"\x00\x01binary"),
            ({"t": "bye"}, b""), ({"t": "lost", "rank": 3, "reason": "x" * 1000}, b"")]
    stream = b"".join(wire.encode_control(b, blob) for b, blob in msgs)
    dec = wire.ControlDecoder()
    got = []
    for i in range(0, len(stream), 7):
        got += dec.feed(stream[i:i + 7])
    assert [(m.body, m.blob) for m in got] == msgs
    assert got[0].type == "kv_set"


def test_control_decoder_rejects_garbage_and_oversize():
    with pytest.raises(ProtocolError):
        wire.ControlDecoder().feed(b"GET / HTTP/1.1\r\n\r\n")
    too_big = struct.pack("<2sBxII", b"MC", wire.VERSION, wire.MAX_CONTROL_JSON + 1, 0)
    with pytest.raises(ProtocolError, match="too large"):
        wire.ControlDecoder().feed(too_big)
    not_object = wire.encode_control({"t": "x"}).replace(b'{"t":"x"}', b'["t","x"]')
    with pytest.raises(ProtocolError, match="object"):
        wire.ControlDecoder().feed(not_object)


def test_wire_is_pure():
    """The wire layer imports no socket, asyncio or other I/O module, and nothing above it."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(wire.__file__).read_text())
    forbidden = {"socket", "asyncio", "threading", "selectors", "ssl", "os", "uvloop", "mmap"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
            if node.level:
                # the collective catalog imports nothing but the standard library
                assert node.module in ("errors", "collectives"), f"wire imports .{node.module}"
                continue
        else:
            continue
        for name in names:
            assert name.split(".")[0] not in forbidden, f"wire imports {name}"
