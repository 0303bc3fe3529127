"""The ranks' processes once started: their exit codes, collected on one thread of the
launcher (no descriptor per rank, unlike a pidfd each; and uvloop keeps SIGCHLD to
itself) and handed to its loop; waiting for them; signalling their sessions."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time

from .ranks import Child


class RankProcesses:
    """This node's ranks' processes (``children``, in rank order)."""

    def __init__(self) -> None:
        self.children: list[Child] = []
        self._reaped_all = False  # the job has ended: the reaper thread stops

    def start_reaping(self, loop: asyncio.AbstractEventLoop) -> None:
        """Collect the ranks' exit codes on a thread of its own, for ``loop``, until
        :meth:`stop_reaping`."""
        threading.Thread(target=self._reap, args=(loop,), name="minidist-reaper",
                         daemon=True).start()

    def stop_reaping(self) -> None:
        """The job has ended: the reaper thread stops (at its next exited process)."""
        self._reaped_all = True

    def _reap(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for any rank to exit and hand its status to the loop, until the job has
        ended."""
        while not self._reaped_all:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:  # none now; a rank started again may come
                time.sleep(0.05)
                continue
            except InterruptedError:
                continue
            try:
                loop.call_soon_threadsafe(self._exited, pid, status)
            except RuntimeError:  # the loop has closed
                return

    def _exited(self, pid: int, status: int) -> None:
        c = next((c for c in self.children if c.pid == pid), None)
        if c is None or c.returncode is not None:
            return
        c.returncode = os.waitstatus_to_exitcode(status)
        if c.popen is not None:
            c.popen.returncode = c.returncode
        if c.exited is not None and not c.exited.done():
            c.exited.set_result(c.returncode)

    async def wait(self, c: Child) -> int:
        """The rank's exit code once it has exited (on the loop)."""
        if c.returncode is None:
            if c.exited is None:
                c.exited = asyncio.get_running_loop().create_future()
            await c.exited
        return c.returncode

    async def wait_all(self, timeout: float) -> None:
        """Return once every rank has exited, or after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while any(c.returncode is None for c in self.children) and loop.time() < end:
            await asyncio.sleep(0.05)

    def kill_all(self, sig: int) -> None:
        """Send ``sig`` to the session of every rank still running (SIGKILL: of every
        rank, also what one that exited left running)."""
        for c in self.children:
            if c.returncode is None or sig == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(c.pid, sig)
