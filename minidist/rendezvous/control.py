"""Control-message streams shared by the rendezvous server and client."""

from __future__ import annotations

import asyncio
from typing import Any

from .. import wire


async def read_control(reader: asyncio.StreamReader) -> wire.Control:
    """Read one control message; IncompleteReadError at end of stream, ProtocolError on garbage."""
    jlen, blen = wire.decode_control_header(await reader.readexactly(wire.CONTROL_HEADER_SIZE))
    raw = await reader.readexactly(jlen)
    blob = await reader.readexactly(blen) if blen else b""
    return wire.decode_control_body(raw, blob)


def write_control(writer: asyncio.StreamWriter, body: dict[str, Any], blob: bytes = b"") -> None:
    """Queue one control message on a stream (the caller drains when it must)."""
    writer.write(wire.encode_control(body, blob))
