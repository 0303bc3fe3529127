"""``minidist run``: start the rendezvous, spawn the ranks, relay their output, tear down.

The launcher hosts the node's one TCP port (the rendezvous) for the whole job, prefixes
every output line with its rank, returns the first failing exit code, and on a failure
or Ctrl-C stops every rank (SIGTERM, then SIGKILL) so that nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
from dataclasses import dataclass, field

from .rendezvous.server import RendezvousServer

KILL_AFTER = 5.0


@dataclass
class RunOptions:
    nproc: int
    command: list[str]
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    grace: float = 5.0
    prefix: bool = True
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class _Rank:
    rank: int
    proc: asyncio.subprocess.Process


class Launcher:
    def __init__(self, opts: RunOptions) -> None:
        if opts.nproc < 1:
            raise ValueError("-n must be at least 1")
        self.opts = opts
        self.world_size = opts.nproc * opts.nnodes
        self.secret = os.environ.get("MINIDIST_SECRET") or secrets.token_hex(16)
        self.ranks: list[_Rank] = []
        self.first_failure: int | None = None
        self._stopping = False
        self._out = sys.stdout.buffer
        self._err = sys.stderr.buffer

    def _child_env(self, local_rank: int) -> dict[str, str]:
        o = self.opts
        rank = o.node_rank * o.nproc + local_rank
        env = dict(os.environ)
        env.update(o.env)
        env.update({
            "MINIDIST_LAUNCHER": "1",
            "MINIDIST_ADDR": o.master_addr,
            "MINIDIST_PORT": str(self.port),
            "MINIDIST_SECRET": self.secret,
            "RANK": str(rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(o.nproc),
            "GROUP_RANK": str(o.node_rank),
            "NODE_RANK": str(o.node_rank),
            "PYTHONUNBUFFERED": "1",
        })
        return env

    async def run(self) -> int:
        """Run the job to the end; return 0 or the first failing rank's exit code."""
        o = self.opts
        server = None
        if o.node_rank == 0:
            host = "127.0.0.1" if o.nnodes == 1 else "0.0.0.0"
            server = RendezvousServer(self.secret.encode(), self.world_size, host=host,
                                      port=o.master_port, generations=True)
            self.port = await server.start()
        else:
            self.port = o.master_port
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            async with asyncio.TaskGroup() as tg:
                for local in range(o.nproc):
                    proc = await asyncio.create_subprocess_exec(
                        *o.command, env=self._child_env(local), stdin=asyncio.subprocess.DEVNULL,
                        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                        start_new_session=True)
                    r = _Rank(o.node_rank * o.nproc + local, proc)
                    self.ranks.append(r)
                    tg.create_task(self._pump(r.rank, proc.stdout, self._out))
                    tg.create_task(self._pump(r.rank, proc.stderr, self._err))
                    tg.create_task(self._watch(r, server))
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await self._kill_all(signal.SIGKILL)
            if server is not None:
                await server.close()
        return self.first_failure or 0

    async def _watch(self, r: _Rank, server: RendezvousServer | None) -> None:
        rc = await r.proc.wait()
        if rc != 0:
            if self.first_failure is None and not self._stopping:
                self.first_failure = rc if rc > 0 else 128 - rc
                self._note(f"rank {r.rank} exited with code {rc}; stopping the job "
                           f"(ranks get {self.opts.grace:g} s to report)")
                if server is not None:
                    server.declare_lost(r.rank, f"its process exited with code {rc}")
                asyncio.get_running_loop().create_task(self._teardown(self.opts.grace))

    async def _teardown(self, grace: float) -> None:
        self._stopping = True
        await self._wait_all(grace)
        await self._kill_all(signal.SIGTERM)
        await self._wait_all(KILL_AFTER)
        await self._kill_all(signal.SIGKILL)

    def _on_signal(self, sig: int) -> None:
        if self.first_failure is None:
            self.first_failure = 128 + sig
        if self._stopping:  # second Ctrl-C: no more waiting
            asyncio.get_running_loop().create_task(self._kill_all(signal.SIGKILL))
            return
        self._note(f"got {signal.Signals(sig).name}; stopping the job")
        asyncio.get_running_loop().create_task(self._teardown(0.0))

    async def _wait_all(self, timeout: float) -> None:
        procs = [r.proc.wait() for r in self.ranks if r.proc.returncode is None]
        if procs:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await asyncio.gather(*procs)

    async def _kill_all(self, sig: int) -> None:
        for r in self.ranks:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r.proc.pid, sig)  # the rank's session: its children too

    async def _pump(self, rank: int, stream: asyncio.StreamReader, out) -> None:
        prefix = f"[rank{rank}]: ".encode() if self.opts.prefix else b""
        pending = b""
        while True:
            chunk = await stream.read(1 << 16)
            if not chunk:
                break
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            if lines:
                out.write(b"".join(prefix + line + b"\n" for line in lines))
                out.flush()
        if pending:
            out.write(prefix + pending + b"\n")
            out.flush()

    def _note(self, text: str) -> None:
        self._err.write(f"minidist run: {text}\n".encode())
        self._err.flush()


def run(opts: RunOptions) -> int:
    """Run a job with the given options; return its exit code."""
    return asyncio.run(Launcher(opts).run())
