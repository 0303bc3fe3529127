"""``minidist run``: start the rendezvous, start the ranks, relay their output, tear down.

The launcher holds the node's one TCP port (the rendezvous) for the whole job, prefixes
every output line with its rank, returns the first failing exit code, and on a failure
or Ctrl-C stops every rank (SIGTERM, then SIGKILL, to each rank's whole session) so
that nothing is left behind.

Ranks start in one of two ways:

* ``fork`` (the default for scripts and modules): the launcher imports numpy and
  minidist once, then forks every rank from itself before it starts any thread or event
  loop. The ranks share those pages copy-on-write, which cuts start-up time and memory
  at hundreds of processes per node.
* ``spawn``: each rank is a fresh ``python -u script.py`` (any command works).

The parts it runs the job with are in :mod:`minidist.launch` (the secret, starting a
rank, the ranks' processes, their output, the failures).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import sys
import types

from . import fdlimits, restarts, segments, tracing
from .env import default_timeout, trace_dir
from .launch import prefork, ranks, shm_usage
from .launch.failures import Failures
from .launch.options import RunOptions
from .launch.output import OutputRelay
from .launch.processes import RankProcesses
from .launch.ranks import Child
from .launch.secret import launcher_secret, public_secret_warning
from .rendezvous.agent import NodeAgent
from .rendezvous.server import RendezvousServer, bind_listeners
from .runtime import new_event_loop
from .transport import addresses

KILL_AFTER = 5.0
AGENT_CONNECT_TIMEOUT = 120.0
SHM_LOOK = 0.1  # seconds between --verbose's looks at the job's /dev/shm (2 ms more a rank)
ORPHAN_AGE = 600.0  # seconds a dead process's segment name is kept from other jobs' sweeps


class Launcher:
    """Runs one node's share of a job."""

    def __init__(self, opts: RunOptions) -> None:
        if opts.nproc < 1:
            raise ValueError("-n must be at least 1")
        if opts.start_method not in ("fork", "spawn"):
            raise ValueError(f"unknown start method {opts.start_method!r}")
        if opts.command is not None and opts.start_method == "fork":
            raise ValueError("an arbitrary command needs --start-method spawn")
        self.opts = opts
        self.world_size = opts.nproc * opts.nnodes
        self.secret, self.public_secret = launcher_secret(opts)
        self.processes = RankProcesses()
        self.output = OutputRelay(opts.prefix, opts.log_dir)
        self.failures = Failures(self.output.last_line)
        self.first_failure: int | None = None  # the job's exit code once a rank failed
        self._killing = False  # the launcher is stopping ranks: their codes are its doing
        self.port = opts.master_port
        self._listeners: list[socket.socket] = []
        self._stopping = False
        self._restarts: dict[int, int] = {}  # rank -> times started again (--restart-failed)
        self._shm_peak = shm_usage.ShmUse()  # --verbose: the most /dev/shm seen held
        self._shm_looks = 0  # --verbose: how many times it was looked at
        self._code: types.CodeType | None = None  # the script, compiled before forking

    @property
    def children(self) -> list[Child]:
        """This node's ranks' processes, in rank order."""
        return self.processes.children

    # ------------------------------------------------------------------ starting ranks

    def start_ranks(self) -> None:
        """Bind the node's port and start every local rank (before any event loop).
        FileLimitError, before anything starts, when even the hard RLIMIT_NOFILE is too
        low for the ranks (the soft limit is raised to it first; the ranks inherit it)."""
        o = self.opts
        short = fdlimits.too_low(fdlimits.launcher_needs(o.nproc, bool(o.log_dir)),
                                 f"minidist run -n {o.nproc}")
        if short is not None:
            raise short
        if o.nnodes > 1 and not o.master_port:
            raise ValueError("a job of several nodes needs --master-port (or MINIDIST_PORT): "
                             "the rendezvous' port on the first node, and every other "
                             "node's agent port")
        self._listeners = bind_listeners("127.0.0.1" if o.nnodes == 1 else "0.0.0.0",
                                         o.master_port, addresses.job_key(self.secret.encode()))
        self.port = self._listeners[-1].getsockname()[1]
        warning = self.secret_warning()
        if warning:
            self.output.note(warning)
        # names left by jobs whose every process was killed (not a running job's stash
        # of a sender killed just now, which its receivers may still read)
        segments.sweep_orphans(older_than=ORPHAN_AGE)
        if o.start_method == "fork":
            self._code = ranks.script_code(o)
            ranks.preload(ranks.heavy_imports(self._code),
                          self._rank_env(0)["OMP_NUM_THREADS"])
            prefork.fill_holes()  # the ranks' own allocations go to pages of their own
            gc.freeze()  # the children's collections leave the shared pages alone
        sys.stdout.flush()
        sys.stderr.flush()
        stdout = self.output.ranks_stdout()
        envs = [(o.node_rank * o.nproc + local, self._rank_env(local))
                for local in range(o.nproc)]
        try:
            if o.start_method == "fork":
                with ranks.shared_environment(envs) as own:
                    ranks.fork_children(o, own, self.children, self._listeners, stdout,
                                        self.output.private(), self._code)
            else:
                for rank, env in envs:
                    self.children.append(ranks.spawn_child(o, rank, env, stdout))
        except OSError as e:  # the ranks already started die with this process
            rank = envs[len(self.children)][0] if len(self.children) < len(envs) else -1
            raise fdlimits.exhausted(e, f"starting rank {rank} of {self.world_size} "
                                     f"(its output pipes)") or e from None
        finally:
            for child in self.children:
                self.output.started(child)

    def secret_warning(self) -> str | None:
        """The warning the first node's launcher prints once when the job's secret is
        derived from public options (several nodes, no secret given); else None."""
        return public_secret_warning(self.opts, self.public_secret)

    def _rank_env(self, local_rank: int) -> dict[str, str]:
        return ranks.rank_env(self.opts, self.port, self.secret, local_rank)

    # ------------------------------------------------------------------ running the job

    async def run(self) -> int:
        """Serve the job until every rank has exited; 0 or the first failing exit code."""
        server = None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        agent = None
        looking: asyncio.Task | None = None
        try:
            if self.opts.node_rank == 0:
                server = RendezvousServer(self.secret.encode(), self.world_size,
                                          generations=True)
                server.on_exhausted = self._out_of_files
                await server.start(self._listeners)
            else:
                agent = NodeAgent(self.secret.encode(), self.opts.master_addr,
                                  self.opts.master_port)
                agent.on_exhausted = self._out_of_files
                await agent.start(self._listeners, timeout=AGENT_CONNECT_TIMEOUT)
            self.processes.start_reaping(loop)
            self.output.relay_stdout(loop)
            if self.opts.verbose:
                looking = loop.create_task(self._look_at_shm())
            async with asyncio.TaskGroup() as tg:
                for c in self.children:
                    tg.create_task(self.output.pump_stderr(c))
                    tg.create_task(self._watch(c, server))
        finally:
            if looking is not None:
                looking.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await looking
            self.output.finish_stdout()
            self.processes.stop_reaping()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            self.processes.kill_all(signal.SIGKILL)
            if server is not None:
                if self.first_failure is None:  # ranks of other nodes may still be at work
                    await server.wait_all_left(default_timeout(os.environ))
                await server.close()
            if agent is not None:
                await agent.close()
            swept = segments.sweep(addresses.job_key(self.secret.encode()))
            if swept:
                self.output.note(f"removed shared memory left by killed ranks: {swept}")
            self._merge_trace()
            if self.opts.verbose:
                self.output.note(self._shm_note())
            for line in self.failures.summary():
                self.output.note(line)
        return self.first_failure or 0

    async def _look_at_shm(self) -> None:
        """With --verbose: how much of /dev/shm the ranks hold, looked at now and then."""
        job = addresses.job_key(self.secret.encode())
        while True:
            use = shm_usage.job_shm(job, [c.pid for c in self.children])
            self._shm_looks += 1
            if use.total >= self._shm_peak.total:
                self._shm_peak = use
            await asyncio.sleep(self._shm_every())

    def _shm_every(self) -> float:
        """Seconds between two looks: more for more ranks, whose /proc each look reads."""
        return SHM_LOOK + 0.002 * len(self.children)

    def _shm_note(self) -> str:
        """The --verbose line: the most seen held, and how many looks saw it (a job
        shorter than a few looks may have held more than any look saw)."""
        p, n = self._shm_peak, self._shm_looks
        return (f"/dev/shm held by this node's ranks, at most: {segments.mib(p.total)} "
                f"({p.segments} segments: {segments.mib(p.named_bytes)} named, "
                f"{segments.mib(p.unlinked_bytes)} mapped after their names were removed; "
                f"looked {'once' if n == 1 else f'{n} times'}, every "
                f"{self._shm_every():.1f} s)")

    def _merge_trace(self) -> None:
        """With MINIDIST_TRACE: merge the ranks' trace files into DIR/<job>.json (every
        rank of this node has exited, so each has written its own)."""
        directory = trace_dir({**os.environ, **self.opts.env})
        if directory is None:
            return
        job = addresses.job_key(self.secret.encode())
        try:
            for path in tracing.merge(directory, job=job):
                self.output.note(f"trace of the job: {path}")
        except (OSError, ValueError) as e:
            self.output.note(f"could not merge the trace in {directory}: {e}")

    async def _watch(self, c: Child, server: RendezvousServer | None) -> None:
        rc = await self.processes.wait(c)
        self.output.exited(c)
        if server is not None and not self._killing:
            server.rank_exited(c.rank, rc)
        if rc != 0 and await self._restarted(c, rc, server):
            return
        if rc == 0 or self._killing:
            return
        self.first_failure = self.failures.add(c.rank, rc)
        if len(self.failures) == 1 and not self._stopping:
            self.output.note(f"rank {c.rank} exited with code {rc}; stopping the job "
                             f"(the other ranks get {self.opts.grace:g} s to report)")
            asyncio.get_running_loop().create_task(self._teardown(self.opts.grace))

    async def _restarted(self, c: Child, rc: int, server: RendezvousServer | None) -> bool:
        """With --restart-failed N: start the rank that exited with ``rc`` again (same
        RANK, MINIDIST_RESTART_COUNT set) unless the job is stopping or the rank's N
        restarts are used; True once the new process has been watched to its end."""
        o = self.opts
        count = self._restarts.get(c.rank, 0) + 1
        if self._stopping or self._killing or count > o.restart_failed:
            return False
        self._restarts[c.rank] = count
        self.output.note(f"rank {c.rank} exited with code {rc}; starting it again "
                         f"({count} of {o.restart_failed})")
        local = c.rank - o.node_rank * o.nproc
        env = {**self._rank_env(local), **restarts.restart_env(count)}
        stdout = self.output.ranks_stdout()
        if o.start_method == "fork":
            c.pid, c.err_fd = restarts.refork(
                os.getpid(), ranks.die_with, lambda: ranks.run_target(o, env, self._code),
                stdout)
            c.popen = None
        else:
            c.popen = ranks.spawn(o, env, stdout)
            c.pid, c.err_fd = c.popen.pid, c.popen.stderr.fileno()
        c.returncode, c.exited = None, None
        self.output.started(c)
        pump = asyncio.ensure_future(self.output.pump_stderr(c))
        await self._watch(c, server)
        await asyncio.gather(pump, return_exceptions=True)
        return True

    async def _teardown(self, grace: float) -> None:
        self._stopping = True
        await self.processes.wait_all(grace)
        self._killing = True
        self.processes.kill_all(signal.SIGTERM)
        await self.processes.wait_all(KILL_AFTER)
        self.processes.kill_all(signal.SIGKILL)

    def _out_of_files(self, err: fdlimits.FileLimitError) -> None:
        """The rendezvous (or agent) could not accept a rank's connection for want of
        file descriptors: the job cannot start; say why, and stop it (not a timeout)."""
        if self._stopping:
            return
        self.output.note(str(err))
        if self.first_failure is None:
            self.first_failure = 1
        self._killing = True
        asyncio.get_running_loop().create_task(self._teardown(0.0))

    def _on_signal(self, sig: int) -> None:
        if self.first_failure is None:
            self.first_failure = 128 + sig
        self._killing = True
        if self._stopping:  # a second Ctrl-C: no more waiting
            self.processes.kill_all(signal.SIGKILL)
            return
        self.output.note(f"got {signal.Signals(sig).name}; stopping the job")
        asyncio.get_running_loop().create_task(self._teardown(0.0))


def run(opts: RunOptions) -> int:
    """Run a job with the given options; return its exit code."""
    from .startup import configure_logging

    launcher = Launcher(opts)
    launcher.start_ranks()
    configure_logging("launcher")
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(launcher.run())
