"""The processes of a vector env and the private minidist job they form.

The parent is rank 0 and hosts the job's rendezvous on a free loopback port; worker
``w`` is rank ``w + 1``, a child process started with the user's ``multiprocessing``
context. Children start before the parent's I/O thread exists (a fork copies no
thread), then learn where the rendezvous is and the job's secret through a pipe of
their own. A worker started again after its process died joins as its rank's next
incarnation.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import signal
import time
from collections.abc import Callable
from typing import Any

from gymnasium.vector.utils import CloudpickleWrapper, clear_mpi_env_vars

from .. import segments, startup
from ..door import Door
from ..env import LaunchConfig
from . import _records as rec
from ._affinity import pin
from ._link import TAG_SETUP, Link
from ._worker import Worker

ADDRESS = "127.0.0.1"
JOIN_GRACE = 10.0  # seconds a closing job waits for its workers' processes to end


def _config(rank: int, world_size: int, port: int, secret: bytes) -> LaunchConfig:
    return LaunchConfig(rank, world_size, rank, world_size, ADDRESS, port, secret, False,
                        "gymnasium")


def child_main(conn: Any, rank: int, world_size: int, env_ids: list[int],
               env_fns: list[CloudpickleWrapper], layout: rec.Layout, autoreset_mode: Any,
               spaces: tuple[Any, Any], collective: bool, semaphore: Any, restarted: bool,
               timeout: float, cpu: int | None) -> None:
    """A worker process: join the job, run its envs until the parent closes them (on
    ``cpu`` only, when not None)."""
    pin(cpu)  # before any thread starts: they all inherit it
    try:
        got = conn.recv()
    except EOFError:  # the parent gave up before the job started
        return
    finally:
        conn.close()
    port, secret = got
    door = startup.start(_config(rank, world_size, port, secret), timeout)
    graceful = True
    try:
        link = Link(door)
        group = link.recv_object(0, TAG_SETUP) if collective else None
        Worker(link, 0, env_ids, env_fns, layout, autoreset_mode, spaces, group, semaphore,
               restarted).run()
    except BaseException:
        graceful = False
        raise
    finally:
        door.leave(graceful=graceful)


class Job:
    """A private job: the parent's door, its workers' processes, their envs."""

    def __init__(self, ctx: Any, blocks: list[range], env_fns: list[Callable[[], Any]],
                 layout: rec.Layout, autoreset_mode: Any, semaphore: Any,
                 spaces: tuple[Any, Any], collective: bool, daemon: bool, timeout: float,
                 name: str, cpus: list[int] | None) -> None:
        self.ctx = ctx
        self.blocks = blocks
        self.env_fns = [CloudpickleWrapper(fn) for fn in env_fns]
        self.layout, self.autoreset_mode, self.semaphore = layout, autoreset_mode, semaphore
        self.spaces, self.collective = spaces, collective
        self.daemon, self.timeout, self.name = daemon, timeout, name
        self.cpus = cpus  # worker w's CPU (None: not pinned)
        self.world_size = len(blocks) + 1
        self.secret = secrets.token_hex(16).encode()
        self.port = 0
        self.processes: list[Any] = [None] * len(blocks)
        pipes = [self._start(w, restarted=False) for w in range(len(blocks))]

        def announce(addr: str, port: int) -> None:
            self.port = port
            for p in pipes:
                p.send((port, self.secret))
                p.close()

        try:
            self.door: Door = startup.start(_config(0, self.world_size, 0, self.secret),
                                            timeout, host=(ADDRESS, 0), announce=announce,
                                            watch=self._check_started)
        except BaseException:
            for p in pipes:
                p.close()
            self.kill()
            raise
        self.link = Link(self.door)
        self.ranks = list(range(1, self.world_size))

    # ------------------------------------------------------------------ processes

    def _start(self, w: int, restarted: bool) -> Any:
        """Start worker ``w``'s process; the parent's end of its pipe."""
        parent, child = self.ctx.Pipe()
        ids = list(self.blocks[w])
        p = self.ctx.Process(
            target=child_main, name=f"Worker<{self.name}>-{w}", daemon=self.daemon,
            args=(child, w + 1, self.world_size, ids, [self.env_fns[i] for i in ids],
                  self.layout, self.autoreset_mode, self.spaces, self.collective,
                  self.semaphore, restarted, self.timeout,
                  None if self.cpus is None else self.cpus[w]))
        with clear_mpi_env_vars():
            p.start()
        child.close()
        self.processes[w] = p
        return parent

    def _check_started(self) -> None:
        for w, p in enumerate(self.processes):
            if p.exitcode is not None:
                raise RuntimeError(f"the process of {self.envs_of(w)} ended before the "
                                   f"vector env started ({exit_text(p.exitcode)})")

    def restart(self, w: int) -> None:
        """Start worker ``w`` again (its process died) and wait until it has joined."""
        old = self.processes[w]
        if old is not None:
            old.join(timeout=1.0)
        pipe = self._start(w, restarted=True)
        pipe.send((self.port, self.secret))
        pipe.close()
        deadline = time.monotonic() + self.timeout
        while not self.link.wait_ranks([w + 1], 0.05):
            p = self.processes[w]
            if p.exitcode is not None:
                raise RuntimeError(f"the process of {self.envs_of(w)}, started again, "
                                   f"ended at once ({exit_text(p.exitcode)})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the process of {self.envs_of(w)}, started again, "
                                   f"did not join within {self.timeout:g} s")

    def envs_of(self, w: int) -> str:
        ids = list(self.blocks[w])
        return f"env {ids[0]}" if len(ids) == 1 else f"envs {ids[0]}-{ids[-1]}"

    def death(self, w: int) -> str:
        """How worker ``w``'s process ended (it was found gone)."""
        p = self.processes[w]
        p.join(timeout=2.0)
        return f"pid {p.pid}, {exit_text(p.exitcode)}"

    # ------------------------------------------------------------------ closing

    def close(self, graceful: bool) -> None:
        """Leave the job, then wait for the workers' processes (killing stragglers) and
        remove the names in /dev/shm that processes killed meanwhile left behind."""
        job = self.door.job
        try:
            self.door.leave(graceful=graceful)
        finally:
            self.join()
            segments.sweep(job)

    def join(self) -> None:
        deadline = time.monotonic() + JOIN_GRACE
        for p in self.processes:
            if p is not None:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        """Kill every worker process still running, and reap it."""
        for p in self.processes:
            if p is not None and p.exitcode is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except (ProcessLookupError, TypeError):
                    pass
        for p in self.processes:
            if p is not None:
                p.join(timeout=5.0)


def exit_text(code: int | None) -> str:
    """A process's exit code in words."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def context(name: str | None) -> Any:
    """The ``multiprocessing`` context the user asked for (None: the default)."""
    return multiprocessing.get_context(name)
