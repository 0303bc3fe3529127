"""Control messages on asyncio streams, shared by the rendezvous, its node agents and the
ranks' clients: the catalog (:mod:`minidist.messages`) says what they are, the wire's
:class:`~minidist.wire.ControlDecoder` how they are cut out of the stream."""

from __future__ import annotations

import asyncio

from .. import messages, wire

READ_CHUNK = 1 << 16  # bytes asked of the stream at a time (more when a message needs it)


class ControlReader:
    """The control messages of one stream, in order."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._decoder = wire.ControlDecoder()

    async def read(self) -> wire.Control:
        """The next message; IncompleteReadError at the end of the stream, ProtocolError
        on bytes that are not a control message (the messages before them come first)."""
        while True:
            msg = self._decoder.next_message()
            if msg is not None:
                return msg
            data = await self._reader.read(max(READ_CHUNK, self._decoder.wanted()))
            if not data:
                raise asyncio.IncompleteReadError(self._decoder.pending(), None)
            self._decoder.add(data)


def write_control(writer: asyncio.StreamWriter, msg: messages.Message | wire.Control,
                  **route: int) -> None:
    """Queue one control message on a stream, with its route if given (see
    :func:`minidist.messages.encode`); the caller drains when it must."""
    writer.write(messages.encode(msg, **route))
