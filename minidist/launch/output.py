"""Relaying the ranks' output: line by line, each line prefixed with its rank (and
written to ``<log_dir>/rank<k>.log`` too when asked), the last lines of each rank's
stderr kept for the closing summary; and the launcher's own notes.

Every rank's stdout is one Unix stream socket, shared by all ranks of the node; the
launcher reads its other end with ``SO_PASSCRED``, so each read carries the writer's
pid (the kernel never joins two writers' bytes in one read), which names the rank (or,
for a process a rank started, the rank whose session it is in). Each rank's stderr is
a pipe of its own, whose end says when the rank has written its last line. So the
launcher holds two descriptors per rank: that pipe and the rank's rendezvous
connection."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import struct
import sys
from typing import BinaryIO

from .ranks import Child

LAST_LINES = 8  # lines of each rank's stderr kept
_CREDS = struct.Struct("iII")  # SCM_CREDENTIALS: pid, uid, gid
_READ = 1 << 16


class OutputRelay:
    """Copies the ranks' pipes to this process's stdout and stderr."""

    def __init__(self, prefix: bool, log_dir: str | None) -> None:
        self.prefix = prefix
        self.log_dir = log_dir
        self.out: BinaryIO = sys.stdout.buffer
        self.err: BinaryIO = sys.stderr.buffer
        self._last_err: dict[int, collections.deque[bytes]] = {}  # each rank's last lines
        self._logs: dict[int, BinaryIO] = {}  # rank -> its log file (with log_dir)
        self._sock: tuple[socket.socket, socket.socket] | None = None  # stdout: (read, write)
        self._rank_of: dict[int, int] = {}  # pid -> rank, of the ranks' processes
        self._partial: dict[int, bytes] = {}  # pid -> the end of its stdout after a newline
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ stdout

    def ranks_stdout(self) -> int:
        """The descriptor every rank's stdout is (the write end of the shared socket)."""
        if self._sock is None:
            r, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            r.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            r.setblocking(False)
            w.shutdown(socket.SHUT_RD)
            self._sock = (r, w)
        return self._sock[1].fileno()

    def private(self) -> list[int]:
        """The launcher's descriptors a forked rank must close (the socket's read end)."""
        return [] if self._sock is None else [self._sock[0].fileno()]

    def started(self, c: Child) -> None:
        """Rank ``c``'s process has started: its stdout is told by its pid."""
        self._rank_of[c.pid] = c.rank

    def relay_stdout(self, loop: asyncio.AbstractEventLoop) -> None:
        """Relay the ranks' stdout on ``loop`` as it comes, until :meth:`finish_stdout`."""
        if self._sock is not None:
            self._loop = loop
            loop.add_reader(self._sock[0].fileno(), self._read_stdout)

    def exited(self, c: Child) -> None:
        """Rank ``c``'s process has exited: what it wrote is in the socket; relay it, and
        its last line if it did not end it."""
        self._read_stdout()
        rest = self._partial.pop(c.pid, b"")
        self._rank_of.pop(c.pid, None)
        if rest:
            self._emit(c.rank, [rest], self.out)

    def finish_stdout(self) -> None:
        """Every rank has exited: relay what is left, and close the socket."""
        if self._sock is None:
            return
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._sock[0].fileno())
        self._read_stdout()
        for pid, rest in list(self._partial.items()):
            if rest:
                self._emit(self._rank(pid), [rest], self.out)
        self._partial.clear()
        for s in self._sock:
            s.close()
        self._sock = None
        for log in self._logs.values():
            with contextlib.suppress(OSError):
                log.close()
        self._logs.clear()

    def _read_stdout(self) -> None:
        """Relay every whole line the socket holds now, each to its writer's rank."""
        if self._sock is None:
            return
        sock, space = self._sock[0], socket.CMSG_SPACE(_CREDS.size)
        while True:
            try:
                data, ancillary, _, _ = sock.recvmsg(_READ, space)
            except OSError:  # nothing more now (BlockingIOError), or the socket is gone
                return
            if not data:
                return
            pid = -1
            for level, kind, value in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _CREDS.unpack_from(value)[0]
            lines = (self._partial.pop(pid, b"") + data).split(b"\n")
            rest = lines.pop()
            if rest:
                self._partial[pid] = rest
            if lines:
                self._emit(self._rank(pid), lines, self.out)

    def _rank(self, pid: int) -> int:
        """The rank of the process ``pid``: a rank's own, or that of the rank whose
        session it is in (a process the rank started); -1 if neither."""
        rank = self._rank_of.get(pid)
        if rank is not None:
            return rank
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                sid = int(f.read().rsplit(b")", 1)[1].split()[3])
        except (OSError, ValueError, IndexError):
            return -1
        return self._rank_of.get(sid, -1)

    def _emit(self, rank: int, lines: list[bytes], out: BinaryIO) -> None:
        """Write rank ``rank``'s whole ``lines`` to ``out`` (this process's stdout or
        stderr), prefixed, and to the rank's log file (rank -1: a writer not known)."""
        prefix = (f"[rank{rank}]: " if rank >= 0 else "[rank?]: ").encode() \
            if self.prefix else b""
        out.write(b"".join(prefix + line + b"\n" for line in lines))
        out.flush()
        log = self._log(rank)
        if log is not None:
            log.write(b"".join(line + b"\n" for line in lines))
            log.flush()

    def _log(self, rank: int) -> BinaryIO | None:
        """Rank ``rank``'s log file (with log_dir), opened once."""
        if not self.log_dir or rank < 0:
            return None
        log = self._logs.get(rank)
        if log is None:
            os.makedirs(self.log_dir, exist_ok=True)
            log = self._logs[rank] = open(  # noqa: SIM115
                os.path.join(self.log_dir, f"rank{rank}.log"), "ab")
        return log

    # ------------------------------------------------------------------ stderr

    async def pump_stderr(self, c: Child) -> None:
        """Relay rank ``c``'s stderr pipe to this process's stderr until it closes (the
        rank's last line, kept for the summary); close it."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(c.err_fd, "rb", 0))
        last = self._last_err.setdefault(c.rank, collections.deque(maxlen=LAST_LINES))
        pending = b""

        def emit(lines: list[bytes]) -> None:
            self._emit(c.rank, lines, self.err)
            last.extend(lines)

        try:
            while True:
                chunk = await reader.read(_READ)
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

    def last_line(self, rank: int) -> bytes:
        """The last line of rank ``rank``'s stderr that is not blank (b"" if none)."""
        lines = self._last_err.get(rank) or ()
        return next((ln for ln in reversed(lines) if ln.strip()), b"")

    def note(self, text: str) -> None:
        """A line of the launcher's own, on stderr."""
        self.err.write(f"minidist run: {text}\n".encode())
        self.err.flush()
