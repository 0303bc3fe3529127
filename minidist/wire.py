"""The minidist wire format: bytes <-> frames. Pure functions, no sockets, no asyncio.

Three kinds of bytes travel on minidist connections:

* the **handshake**, fixed-size so an acceptor reads a bounded number of bytes from a
  stranger: the acceptor sends a :data:`CHALLENGE_SIZE`-byte challenge with a random
  nonce, the connector answers with a :data:`HELLO_SIZE`-byte hello carrying an
  HMAC-SHA256 of both nonces and its identity under the job secret plus a nonce of its
  own, and the acceptor answers a :data:`ACK_SIZE`-byte ack (status 0 = admitted) whose
  HMAC proves in turn that the acceptor knows the secret: both ends authenticate;
* **data frames** between processes: a :data:`HEADER_SIZE`-byte header, then the raw
  array bytes (never pickled);
* **control messages** to and from the rendezvous/agent: a 12-byte header, a UTF-8
  JSON body and an optional binary blob.

All integers are little-endian.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

from .collectives import KINDS
from .errors import ProtocolError

VERSION = 2

# --------------------------------------------------------------------------- handshake

_CHALLENGE = struct.Struct("<4sBB2x16s")  # magic, version, acceptor role, nonce
# magic, version, connector role, src's incarnation, src, dst, connector's nonce, mac
_HELLO = struct.Struct("<4sBBHii16s32s")
_ACK = struct.Struct("<4sBBxx32s")  # magic, version, status, mac
CHALLENGE_SIZE = _CHALLENGE.size
HELLO_SIZE = _HELLO.size
ACK_SIZE = _ACK.size
_HS_MAGIC = b"MDHS"
_NO_MAC = bytes(32)


class Role(enum.IntEnum):
    """Who is at either end of a connection."""

    AGENT = 1  # the node agent / rendezvous server
    PEER = 2  # a rank talking to another rank
    PROCESS = 3  # a rank talking to the agent


class AckStatus(enum.IntEnum):
    OK = 0
    BAD_SECRET = 1
    WRONG_DESTINATION = 2
    VERSION_MISMATCH = 3


def encode_challenge(role: Role, nonce: bytes) -> bytes:
    """The acceptor's first bytes: its role and a 16-byte random nonce."""
    if len(nonce) != 16:
        raise ValueError("nonce must be 16 bytes")
    return _CHALLENGE.pack(_HS_MAGIC, VERSION, role, nonce)


def decode_challenge(data: bytes) -> tuple[Role, bytes]:
    """(acceptor role, nonce) from a challenge; ProtocolError if it is not one."""
    magic, version, role, nonce = _unpack(_CHALLENGE, data, "challenge")
    _check(magic == _HS_MAGIC, "bad handshake magic")
    _check(version == VERSION, f"protocol version {version}, expected {VERSION}")
    return _role(role), nonce


def hello_mac(secret: bytes, nonce: bytes, answer: bytes, role: Role, src: int,
              dst: int, incarnation: int = 0) -> bytes:
    """The connector's proof: HMAC-SHA256(secret, "hello" || acceptor's nonce ||
    connector's nonce || role || src || dst [|| incarnation, when not 0])."""
    msg = b"hello" + nonce + answer + struct.pack("<Bii", role, src, dst)
    if incarnation:
        msg += struct.pack("<H", incarnation)
    return hmac.new(secret, msg, hashlib.sha256).digest()


def ack_mac(secret: bytes, nonce: bytes, answer: bytes, status: AckStatus) -> bytes:
    """The acceptor's proof: HMAC-SHA256(secret, "ack" || acceptor's nonce || connector's
    nonce || status). Distinct from :func:`hello_mac`, so neither can be replayed as the
    other."""
    msg = b"ack" + nonce + answer + struct.pack("<B", status)
    return hmac.new(secret, msg, hashlib.sha256).digest()


def encode_hello(secret: bytes, nonce: bytes, role: Role, src: int, dst: int,
                 answer: bytes, incarnation: int = 0) -> bytes:
    """The connector's answer to a challenge: who it is (``incarnation``: how often its
    rank was restarted, mod 65536), whom it wants, its own 16-byte nonce ``answer``
    (which the acceptor's ack must prove it saw) and the proof."""
    if len(answer) != 16:
        raise ValueError("nonce must be 16 bytes")
    incarnation &= 0xFFFF
    return _HELLO.pack(_HS_MAGIC, VERSION, role, incarnation, src, dst, answer,
                       hello_mac(secret, nonce, answer, role, src, dst, incarnation))


@dataclass(frozen=True, slots=True)
class Hello:
    role: Role
    src: int
    dst: int
    nonce: bytes  # the connector's nonce
    mac: bytes
    incarnation: int = 0  # how often the connector's rank was restarted (mod 65536)

    def verify(self, secret: bytes, nonce: bytes) -> bool:
        """True if the hello proves knowledge of ``secret`` for this challenge nonce."""
        good = hello_mac(secret, nonce, self.nonce, self.role, self.src, self.dst,
                         self.incarnation)
        return hmac.compare_digest(good, self.mac)


def decode_hello(data: bytes) -> Hello:
    """Parse a hello; ProtocolError if the bytes are not one (nothing is trusted yet)."""
    magic, version, role, inc, src, dst, answer, mac = _unpack(_HELLO, data, "hello")
    _check(magic == _HS_MAGIC, "bad handshake magic")
    _check(version == VERSION, f"protocol version {version}, expected {VERSION}")
    return Hello(_role(role), src, dst, answer, mac, inc)


def encode_ack(status: AckStatus, secret: bytes | None = None, nonce: bytes = b"",
               answer: bytes = b"") -> bytes:
    """The acceptor's verdict. An OK ack carries :func:`ack_mac` (``secret``, the
    challenge's ``nonce`` and the hello's ``answer`` are needed); a refusal proves
    nothing."""
    mac = ack_mac(secret, nonce, answer, status) if secret is not None else _NO_MAC
    return _ACK.pack(_HS_MAGIC, VERSION, status, mac)


def decode_ack(data: bytes, secret: bytes | None = None, nonce: bytes = b"",
               answer: bytes = b"") -> AckStatus:
    """The status of an ack. With ``secret``, an OK ack must also prove that the
    acceptor knows the secret and saw this handshake's nonces (ProtocolError if not)."""
    magic, version, status, mac = _unpack(_ACK, data, "ack")
    _check(magic == _HS_MAGIC, "bad handshake magic")
    _check(version == VERSION, f"protocol version {version}, expected {VERSION}")
    try:
        status = AckStatus(status)
    except ValueError:
        raise ProtocolError(f"unknown ack status {status}") from None
    if status == AckStatus.OK and secret is not None:
        _check(hmac.compare_digest(ack_mac(secret, nonce, answer, status), mac),
               "the acceptor does not know the job secret (its ack does not verify)")
    return status


# --------------------------------------------------------------------------- data frames


Kind = enum.IntEnum("Kind", KINDS)
Kind.__doc__ = """What a data frame belongs to: a collective (its number is its record's
``kind`` in :mod:`minidist.collectives`) or a point-to-point message (P2P)."""


# magic, version, kind, dtype, op, algorithm, flags,
# group, seq, src, root, tag, shape digest, count, nbytes, reserved
_HEADER = struct.Struct("<2sBBBBBBQQiiIIQQQ")
HEADER_SIZE = _HEADER.size
_DATA_MAGIC = b"MD"
assert HEADER_SIZE == 64


class Header(NamedTuple):
    """One data frame's header.

    ``count`` is the element count of the whole call (as the sender sees it), ``nbytes``
    the length of the payload that follows this header. ``seq`` numbers the collectives
    of a group (for point-to-point: the messages of one (src, dst, tag) triple). A named
    tuple: immutable, and made several times faster than a frozen dataclass, once per
    frame sent and per frame received.
    """

    kind: Kind
    dtype: int
    op: int
    algorithm: int
    group: int
    seq: int
    src: int
    root: int
    tag: int
    shape: int
    count: int
    nbytes: int
    flags: int = 0


_KINDS = {k.value: k for k in Kind}


def encode_header(h: Header) -> bytes:
    """The 64 bytes of a header."""
    return _HEADER.pack(_DATA_MAGIC, VERSION, h.kind, h.dtype, h.op, h.algorithm, h.flags,
                        h.group, h.seq, h.src, h.root, h.tag, h.shape, h.count, h.nbytes, 0)


def encode_p2p(dtype: int, flags: int, group: int, seq: int, src: int, tag: int,
               shape: int, count: int, nbytes: int) -> bytes:
    """The 64 bytes of a point-to-point message's header (:func:`encode_header` of
    ``Header(Kind.P2P, dtype, 0, 0, group, seq, src, -1, tag, shape, count, nbytes,
    flags)``), without making the Header: a sender makes one per message, and a
    receiver makes the one it expects, to compare with what arrives."""
    return _HEADER.pack(_DATA_MAGIC, VERSION, Kind.P2P, dtype, 0, 0, flags, group, seq, src,
                        -1, tag, shape, count, nbytes, 0)


def decode_header(data: bytes | bytearray | memoryview) -> Header:
    """Parse 64 header bytes; ProtocolError for a bad magic, version or kind."""
    (magic, version, kind, dtype, op, algorithm, flags, group, seq, src, root, tag, shape,
     count, nbytes, _reserved) = _unpack(_HEADER, data, "frame header")
    kind_ = _KINDS.get(kind)
    if magic != _DATA_MAGIC or version != VERSION or kind_ is None:  # the messages cost
        _check(magic == _DATA_MAGIC, f"bad frame magic {bytes(magic)!r}")
        _check(version == VERSION, f"frame protocol version {version}, expected {VERSION}")
        _check(False, f"unknown frame kind {kind}")
    return Header(kind_, dtype, op, algorithm, group, seq, src, root, tag, shape, count,
                  nbytes, flags)


def shape_digest(shape: tuple[int, ...]) -> int:
    """A 32-bit digest of an array shape, so receivers can tell (2, 3) from (3, 2)."""
    return zlib.crc32(struct.pack(f"<{len(shape)}q", *shape)) if shape else 0


class FrameEnd(NamedTuple):
    """:meth:`FrameDecoder.next_event`: the payload of the frame ``header`` is complete
    in the destination given for it, with the caller's ``token``."""

    header: Header
    token: object


NEED_DATA = "need data"  # :meth:`FrameDecoder.next_event`: feed :meth:`~FrameDecoder.buffer`


FIRST_STAGE = 4096  # a new connection's staging buffer (bytes)


class FrameDecoder:
    """The data frames of one stream from rank ``peer``, decoded without I/O (h11's
    style): the caller reads bytes into :meth:`buffer`, says how many with
    :meth:`received`, and asks :meth:`next_event` what happened:

    * ``NEED_DATA``: read more into :meth:`buffer`;
    * a :class:`Header`: a frame begins; the caller must answer :meth:`deliver_to` with
      where its payload goes (a writable view of exactly ``nbytes``), or None to drop it;
    * a :class:`FrameEnd`: that payload is complete.

    Small frames are read many at a time into a staging buffer of at most ``stage``
    bytes (it starts at :data:`FIRST_STAGE` and doubles while reads fill it, so that a
    connection that carries little holds little) and
    copied out; the rest of a larger payload is read straight into its destination, and
    a dropped one through a slice of the staging buffer, so no payload byte is copied
    more than once. ProtocolError for bytes that are not a frame, or a frame that
    claims another sender."""

    def __init__(self, peer: int, stage: int = 1 << 16) -> None:
        if stage < HEADER_SIZE:
            raise ValueError(f"the staging buffer must hold a header ({HEADER_SIZE} bytes)")
        self.peer = peer
        self._most = stage
        self._stage = bytearray(min(stage, FIRST_STAGE))
        self._view = memoryview(self._stage)
        self._start = self._end = 0  # the staged bytes not yet taken
        self._dest: memoryview | None = None  # a payload read straight into its place
        self._done = 0
        self._header: Header | None = None
        self._token: object = None
        self._discard = 0  # payload bytes still to drop
        self._answer = False  # a header was announced and awaits deliver_to

    def buffer(self) -> memoryview:
        """Where the next bytes of the stream go (at least one byte long)."""
        if self._discard:
            return self._view[:min(self._discard, len(self._stage))]
        if self._dest is not None:
            return self._dest[self._done:]
        if self._end == len(self._stage):  # full: grow, or the staged rest to the front
            left = self._end - self._start
            if len(self._stage) < self._most:
                grown = bytearray(min(2 * len(self._stage), self._most))
                grown[:left] = self._view[self._start:self._end]
                self._stage, self._view = grown, memoryview(grown)
            elif not self._start:
                raise RuntimeError("FrameDecoder: next_event() must take the staged frames")
            else:
                self._stage[:left] = self._stage[self._start:self._end]
            self._start, self._end = 0, left
        return self._view[self._end:]

    def received(self, n: int) -> None:
        """``n`` bytes were written at the start of the last :meth:`buffer`."""
        if self._discard:
            self._discard -= n
        elif self._dest is not None:
            self._done += n
        else:
            self._end += n

    def next_event(self) -> Header | FrameEnd | str:
        """What the bytes so far make: ``NEED_DATA``, a :class:`Header` or a
        :class:`FrameEnd` (see the class)."""
        if self._answer:
            raise RuntimeError("FrameDecoder: deliver_to() must answer the last header")
        if self._discard:
            return NEED_DATA
        if self._dest is not None:
            if self._done < self._dest.nbytes:
                return NEED_DATA
            end = FrameEnd(self._header, self._token)
            self._dest, self._done, self._header, self._token = None, 0, None, None
            return end
        start = self._start
        if self._end - start < HEADER_SIZE:
            if start == self._end:
                self._start = self._end = 0
            return NEED_DATA
        h = decode_header(self._view[start:start + HEADER_SIZE])
        if h.src != self.peer:
            raise ProtocolError(f"frame claims src {h.src} on a connection from rank "
                                f"{self.peer}")
        self._start = start + HEADER_SIZE
        self._header, self._answer = h, True
        return h

    def deliver_to(self, dest: memoryview | None, token: object = None) -> FrameEnd | None:
        """Where the payload of the frame just announced goes (``dest``, exactly its
        ``nbytes``; None: drop it). Returns its :class:`FrameEnd` at once if the payload
        was staged whole (copied into ``dest``), else None: :meth:`next_event` returns
        it once the rest has arrived (never for a dropped payload)."""
        if not self._answer:
            raise RuntimeError("FrameDecoder: no header awaits a destination")
        self._answer = False
        h = self._header
        have = min(self._end - self._start, h.nbytes)
        at = self._start
        self._start = at + have
        if dest is None:
            self._header = None
            self._discard = h.nbytes - have
            return None
        if dest.nbytes != h.nbytes:
            raise ValueError(f"a destination of {dest.nbytes} bytes for a payload of "
                             f"{h.nbytes}")
        dest[:have] = self._view[at:at + have]
        if have < h.nbytes:  # the staging buffer is empty now: the rest goes to dest
            self._dest, self._done, self._token = dest, have, token
            return None
        self._header = None
        return FrameEnd(h, token)


# --------------------------------------------------------------------------- control

_CONTROL = struct.Struct("<2sBxII")  # magic, version, json length, blob length
CONTROL_HEADER_SIZE = _CONTROL.size
_CONTROL_MAGIC = b"MC"
MAX_CONTROL_JSON = 4 << 20
MAX_CONTROL_BLOB = 1 << 30


@dataclass(frozen=True, slots=True)
class Control:
    """A control message: a JSON object (its ``"t"`` names the type) and a binary blob."""

    body: dict[str, Any]
    blob: bytes = b""

    @property
    def type(self) -> str:
        return self.body.get("t", "")


def encode_control(body: dict[str, Any], blob: bytes = b"") -> bytes:
    """Serialize a control message."""
    raw = json.dumps(body, separators=(",", ":")).encode()
    if len(raw) > MAX_CONTROL_JSON or len(blob) > MAX_CONTROL_BLOB:
        raise ValueError("control message too large")
    return _CONTROL.pack(_CONTROL_MAGIC, VERSION, len(raw), len(blob)) + raw + bytes(blob)


def decode_control_header(data: bytes) -> tuple[int, int]:
    """(json length, blob length) from a control header; ProtocolError if invalid."""
    magic, version, jlen, blen = _unpack(_CONTROL, data, "control header")
    _check(magic == _CONTROL_MAGIC, f"bad control magic {bytes(magic)!r}")
    _check(version == VERSION, f"control protocol version {version}, expected {VERSION}")
    _check(jlen <= MAX_CONTROL_JSON and blen <= MAX_CONTROL_BLOB, "control message too large")
    return jlen, blen


def decode_control_body(raw: bytes, blob: bytes = b"") -> Control:
    """Parse the JSON body of a control message; ProtocolError if it is not an object."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"control body is not JSON: {e}") from None
    _check(isinstance(body, dict), "control body is not a JSON object")
    return Control(body, bytes(blob))


class ControlDecoder:
    """Incremental decoder: add bytes as they arrive, take complete messages out. The
    chunks of a large message are joined once, when it is complete."""

    def __init__(self) -> None:
        self._buf = b""  # unread bytes from _pos on, then the chunks in _more
        self._pos = 0
        self._more: list[bytes] = []
        self._size = 0  # unread bytes in all

    def add(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes read from the stream."""
        if data:
            self._more.append(bytes(data))
            self._size += len(data)

    def next_message(self) -> Control | None:
        """The next complete message, or None until more bytes come. ProtocolError once
        the bytes at the head of the stream are not a control message (every message
        before them is returned first)."""
        header = self._header()
        if header is None:
            return None
        jlen, blen = header
        total = CONTROL_HEADER_SIZE + jlen + blen
        if self._size < total:
            return None
        self._contiguous(total)
        j0 = self._pos + CONTROL_HEADER_SIZE
        raw, blob = self._buf[j0:j0 + jlen], self._buf[j0 + jlen:j0 + jlen + blen]
        self._pos += total
        self._size -= total
        if self._pos == len(self._buf):
            self._buf, self._pos = b"", 0
        return decode_control_body(raw, blob)

    def wanted(self) -> int:
        """How many more bytes the message at the head needs (at least 1)."""
        header = self._header()
        if header is None:
            return CONTROL_HEADER_SIZE - self._size
        return max(1, CONTROL_HEADER_SIZE + sum(header) - self._size)

    def pending(self) -> bytes:
        """The bytes of a message not yet complete."""
        return b"".join([self._buf[self._pos:], *self._more])

    def feed(self, data: bytes) -> list[Control]:
        """Add bytes; return every message now complete. ProtocolError on garbage."""
        self.add(data)
        out = []
        while (msg := self.next_message()) is not None:
            out.append(msg)
        return out

    def _header(self) -> tuple[int, int] | None:
        """(json length, blob length) of the message at the head; None until its header
        is in."""
        if self._size < CONTROL_HEADER_SIZE:
            return None
        self._contiguous(CONTROL_HEADER_SIZE)
        return decode_control_header(self._buf[self._pos:self._pos + CONTROL_HEADER_SIZE])

    def _contiguous(self, n: int) -> None:
        """Make the first ``n`` unread bytes (all there) one piece of ``_buf``."""
        if len(self._buf) - self._pos < n:
            self._buf = b"".join([self._buf[self._pos:], *self._more])
            self._pos = 0
            self._more = []


# --------------------------------------------------------------------------- helpers


def _unpack(s: struct.Struct, data: bytes | bytearray | memoryview, what: str) -> tuple:
    if len(data) != s.size:
        raise ProtocolError(f"{what}: expected {s.size} bytes, got {len(data)}")
    return s.unpack(data)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ProtocolError(message)


def _role(value: int) -> Role:
    try:
        return Role(value)
    except ValueError:
        raise ProtocolError(f"unknown role {value}") from None
