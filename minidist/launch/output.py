"""Relaying the ranks' output: line by line, each line prefixed with its rank (and
written to ``<log_dir>/rank<k>.log`` too when asked), the last lines of each rank's
stderr kept for the closing summary; and the launcher's own notes."""

from __future__ import annotations

import asyncio
import collections
import os
import sys
from collections.abc import Coroutine
from typing import Any, BinaryIO

from .ranks import Child

LAST_LINES = 8  # lines of each rank's stderr kept


class OutputRelay:
    """Copies the ranks' pipes to this process's stdout and stderr."""

    def __init__(self, prefix: bool, log_dir: str | None) -> None:
        self.prefix = prefix
        self.log_dir = log_dir
        self.out: BinaryIO = sys.stdout.buffer
        self.err: BinaryIO = sys.stderr.buffer
        self._last_err: dict[int, collections.deque[bytes]] = {}  # each rank's last lines

    def pumps(self, c: Child) -> list[Coroutine[Any, Any, None]]:
        """What relays rank ``c``'s stdout and stderr until they close."""
        return [self.pump(c.rank, c.out_fd, self.out), self.pump(c.rank, c.err_fd, self.err)]

    async def pump(self, rank: int, fd: int, out: BinaryIO) -> None:
        """Relay pipe ``fd`` of rank ``rank`` to ``out`` (this process's stdout or
        stderr) until it closes; close it."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
        prefix = f"[rank{rank}]: ".encode() if self.prefix else b""
        last = self._last_err.setdefault(rank, collections.deque(maxlen=LAST_LINES)) \
            if out is self.err else None
        log = None
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            log = open(os.path.join(self.log_dir, f"rank{rank}.log"), "ab")  # noqa: SIM115
        pending = b""

        def emit(lines: list[bytes]) -> None:
            out.write(b"".join(prefix + line + b"\n" for line in lines))
            out.flush()
            if log is not None:
                log.write(b"".join(line + b"\n" for line in lines))
                log.flush()
            if last is not None:
                last.extend(lines)

        try:
            while True:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    break
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                if lines:
                    emit(lines)
            if pending:
                emit([pending])
        finally:
            transport.close()
            if log is not None:
                log.close()

    def last_line(self, rank: int) -> bytes:
        """The last line of rank ``rank``'s stderr that is not blank (b"" if none)."""
        lines = self._last_err.get(rank) or ()
        return next((ln for ln in reversed(lines) if ln.strip()), b"")

    def note(self, text: str) -> None:
        """A line of the launcher's own, on stderr."""
        self.err.write(f"minidist run: {text}\n".encode())
        self.err.flush()
