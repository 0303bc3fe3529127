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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import gc
import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from . import fdlimits, restarts, segments, tracing
from .env import default_timeout, given_secret, trace_dir
from .rendezvous.agent import NodeAgent
from .rendezvous.server import RendezvousServer, bind_listeners
from .runtime import new_event_loop
from .transport import addresses

KILL_AFTER = 5.0
AGENT_CONNECT_TIMEOUT = 120.0
ORPHAN_AGE = 600.0  # seconds a dead process's segment name is kept from other jobs' sweeps


@dataclass
class RunOptions:
    """What ``minidist run`` was asked to do.

    ``target`` is a script path (or a module name with ``module=True``) run with
    ``args``; ``command``, if given, replaces it with any command (spawn only).
    """

    nproc: int
    target: str = ""
    args: list[str] = field(default_factory=list)
    module: bool = False
    command: list[str] | None = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    grace: float = 5.0
    prefix: bool = True
    log_dir: str | None = None  # also write each rank's output to <log_dir>/rank<k>.log
    secret_file: str | None = None  # the job secret, read from this file (--secret-file)
    start_method: str = "fork"
    env: dict[str, str] = field(default_factory=dict)
    restart_failed: int = 0  # times a rank that died (or raised) is started again


@dataclass
class _Child:
    rank: int
    pid: int
    out_fd: int
    err_fd: int
    popen: subprocess.Popen | None = None
    returncode: int | None = None
    exited: asyncio.Future | None = None  # done with the exit code (on the launcher's loop)


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
        self.secret = _secret_from_file(opts.secret_file) if opts.secret_file else \
            given_secret(os.environ)
        self.public_secret = self.secret is None and opts.nnodes > 1
        if self.secret is None:
            # the nodes' launchers must agree without talking: derived, so not secret
            # (a warning says so once the job starts)
            self.secret = hashlib.sha256(
                f"minidist:{opts.master_addr}:{opts.master_port}".encode()).hexdigest() \
                if opts.nnodes > 1 else secrets.token_hex(16)
        self.children: list[_Child] = []
        self.first_failure: int | None = None  # the job's exit code once a rank failed
        self._failures: list[tuple[int, int]] = []  # (rank, code) of ranks that failed
        self._last_err: dict[int, collections.deque[bytes]] = {}  # each rank's last lines
        self._killing = False  # the launcher is stopping ranks: their codes are its doing
        self.port = opts.master_port
        self._listeners: list[socket.socket] = []
        self._stopping = False
        self._reaped_all = False  # the job has ended: the reaper thread stops
        self._restarts: dict[int, int] = {}  # rank -> times started again (--restart-failed)
        self._out = sys.stdout.buffer
        self._err = sys.stderr.buffer

    # ------------------------------------------------------------------ starting ranks

    def _child_env(self, local_rank: int) -> dict[str, str]:
        o = self.opts
        return {
            **o.env,
            "MINIDIST_LAUNCHER": "1",
            "MINIDIST_ADDR": o.master_addr,
            "MINIDIST_PORT": str(self.port),
            # torchrun's names too, so that torch code runs unchanged (torch.distributed's
            # "minidist" backend joins this job's rendezvous, opening no port of its own)
            "MASTER_ADDR": o.master_addr,
            "MASTER_PORT": str(self.port),
            "MINIDIST_SECRET": self.secret,
            "RANK": str(o.node_rank * o.nproc + local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(o.nproc),
            "GROUP_RANK": str(o.node_rank),
            "NODE_RANK": str(o.node_rank),
            "PYTHONUNBUFFERED": "1",
            # as torchrun does: N ranks of a node must not each start a thread per core
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or (
                "1" if o.nproc > 1 else str(os.cpu_count() or 1)),
        }

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
            self._note(warning)
        # names left by jobs whose every process was killed (not a running job's stash
        # of a sender killed just now, which its receivers may still read)
        segments.sweep_orphans(older_than=ORPHAN_AGE)
        if o.start_method == "fork":
            _preload()
            gc.freeze()  # the children's collections leave the shared pages alone
        sys.stdout.flush()
        sys.stderr.flush()
        for local in range(o.nproc):
            rank = o.node_rank * o.nproc + local
            try:
                if o.start_method == "fork":
                    self.children.append(self._fork(rank, local))
                else:
                    self.children.append(self._spawn(rank, local))
            except OSError as e:  # the ranks already started die with this process
                raise fdlimits.exhausted(e, f"starting rank {rank} of {self.world_size} "
                                         f"(its output pipes)") or e from None

    def secret_warning(self) -> str | None:
        """The warning the first node's launcher prints once when the job's secret is
        derived from public options (several nodes, no secret given); else None."""
        if not self.public_secret or self.opts.node_rank != 0:
            return None
        return ("warning: no MINIDIST_SECRET or --secret-file: this job's secret is "
                "derived from --master-addr and --master-port, which anyone can compute, "
                "so its port keeps no stranger out. Give every node's launcher the same "
                "random secret: --secret-file PATH (e.g. made with `python -c \"import "
                "secrets; print(secrets.token_hex(32))\" > PATH; chmod 600 PATH`) or "
                "MINIDIST_SECRET")

    def _spawn(self, rank: int, local: int) -> _Child:
        o = self.opts
        cmd = o.command or [sys.executable, "-u", *(["-m"] if o.module else []), o.target,
                            *o.args]
        launcher = os.getpid()
        p = subprocess.Popen(cmd, env={**os.environ, **self._child_env(local)},
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True,
                             preexec_fn=lambda: die_with(launcher))
        return _Child(rank, p.pid, p.stdout.fileno(), p.stderr.fileno(), p)

    def _fork(self, rank: int, local: int) -> _Child:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        launcher = os.getpid()
        pid = os.fork()
        if pid:
            os.close(out_w)
            os.close(err_w)
            return _Child(rank, pid, out_r, err_r)
        # the child: never returns
        code = 1
        try:
            os.setsid()
            die_with(launcher)
            for c in self.children:
                os.close(c.out_fd)
                os.close(c.err_fd)
            for s in self._listeners:
                s.close()
            os.close(out_r)
            os.close(err_r)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in (devnull, out_w, err_w):
                os.close(fd)
            code = _run_target(self.opts, self._child_env(local))
        finally:
            os._exit(code)

    # ------------------------------------------------------------------ running the job

    async def run(self) -> int:
        """Serve the job until every rank has exited; 0 or the first failing exit code."""
        server = None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        agent = None
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
            threading.Thread(target=self._reap, args=(loop,), name="minidist-reaper",
                             daemon=True).start()
            async with asyncio.TaskGroup() as tg:
                for c in self.children:
                    tg.create_task(self._pump(c.rank, c.out_fd, self._out))
                    tg.create_task(self._pump(c.rank, c.err_fd, self._err))
                    tg.create_task(self._watch(c, server))
        finally:
            self._reaped_all = True
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            self._kill_all(signal.SIGKILL)
            if server is not None:
                if self.first_failure is None:  # ranks of other nodes may still be at work
                    await server.wait_all_left(default_timeout(os.environ))
                await server.close()
            if agent is not None:
                await agent.close()
            swept = segments.sweep(addresses.job_key(self.secret.encode()))
            if swept:
                self._note(f"removed shared memory left by killed ranks: {swept}")
            self._merge_trace()
            for line in self.summary():
                self._note(line)
        return self.first_failure or 0

    def _merge_trace(self) -> None:
        """With MINIDIST_TRACE: merge the ranks' trace files into DIR/<job>.json (every
        rank of this node has exited, so each has written its own)."""
        directory = trace_dir({**os.environ, **self.opts.env})
        if directory is None:
            return
        job = addresses.job_key(self.secret.encode())
        try:
            for path in tracing.merge(directory, job=job):
                self._note(f"trace of the job: {path}")
        except (OSError, ValueError) as e:
            self._note(f"could not merge the trace in {directory}: {e}")

    async def _wait_child(self, c: _Child) -> int:
        """The rank's exit code once it has exited (collected by :meth:`_reap`: no
        descriptor per rank)."""
        if c.returncode is None:
            if c.exited is None:
                c.exited = asyncio.get_running_loop().create_future()
            await c.exited
        return c.returncode

    def _reap(self, loop: asyncio.AbstractEventLoop) -> None:
        """On a thread of its own: wait for any rank to exit and hand its status to the
        loop, until the job has ended (no descriptor per rank, unlike a pidfd each; and
        uvloop keeps SIGCHLD to itself)."""
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

    async def _watch(self, c: _Child, server: RendezvousServer | None) -> None:
        rc = await self._wait_child(c)
        if server is not None and not self._killing:
            server.rank_exited(c.rank, rc)
        if rc != 0 and await self._restarted(c, rc, server):
            return
        if rc == 0 or self._killing:
            return
        self._failures.append((c.rank, rc))
        # a rank killed by a signal is the root cause of the others' failures: its code
        # is the job's, even when a survivor's exit was seen first
        _, code = self._root_cause()
        self.first_failure = code if code > 0 else 128 - code
        if len(self._failures) == 1 and not self._stopping:
            self._note(f"rank {c.rank} exited with code {rc}; stopping the job "
                       f"(the other ranks get {self.opts.grace:g} s to report)")
            asyncio.get_running_loop().create_task(self._teardown(self.opts.grace))

    async def _restarted(self, c: _Child, rc: int, server: RendezvousServer | None) -> bool:
        """With --restart-failed N: start the rank that exited with ``rc`` again (same
        RANK, MINIDIST_RESTART_COUNT set) unless the job is stopping or the rank's N
        restarts are used; True once the new process has been watched to its end."""
        o = self.opts
        count = self._restarts.get(c.rank, 0) + 1
        if self._stopping or self._killing or count > o.restart_failed:
            return False
        self._restarts[c.rank] = count
        self._note(f"rank {c.rank} exited with code {rc}; starting it again "
                   f"({count} of {o.restart_failed})")
        local = c.rank - o.node_rank * o.nproc
        env = {**self._child_env(local), **restarts.restart_env(count)}
        if o.start_method == "fork":
            c.pid, c.out_fd, c.err_fd = restarts.refork(
                os.getpid(), die_with, lambda: _run_target(o, env))
            c.popen = None
        else:
            cmd = o.command or [sys.executable, "-u", *(["-m"] if o.module else []),
                                o.target, *o.args]
            launcher = os.getpid()
            c.popen = subprocess.Popen(cmd, env={**os.environ, **env},
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True,
                                       preexec_fn=lambda: die_with(launcher))
            c.pid, c.out_fd, c.err_fd = c.popen.pid, c.popen.stdout.fileno(), \
                c.popen.stderr.fileno()
        c.returncode, c.exited = None, None
        pumps = [asyncio.ensure_future(self._pump(c.rank, fd, out))
                 for fd, out in ((c.out_fd, self._out), (c.err_fd, self._err))]
        await self._watch(c, server)
        await asyncio.gather(*pumps, return_exceptions=True)
        return True

    async def _teardown(self, grace: float) -> None:
        self._stopping = True
        await self._wait_all(grace)
        self._killing = True
        self._kill_all(signal.SIGTERM)
        await self._wait_all(KILL_AFTER)
        self._kill_all(signal.SIGKILL)

    def _out_of_files(self, err: fdlimits.FileLimitError) -> None:
        """The rendezvous (or agent) could not accept a rank's connection for want of
        file descriptors: the job cannot start; say why, and stop it (not a timeout)."""
        if self._stopping:
            return
        self._note(str(err))
        if self.first_failure is None:
            self.first_failure = 1
        self._killing = True
        asyncio.get_running_loop().create_task(self._teardown(0.0))

    def _on_signal(self, sig: int) -> None:
        if self.first_failure is None:
            self.first_failure = 128 + sig
        self._killing = True
        if self._stopping:  # a second Ctrl-C: no more waiting
            self._kill_all(signal.SIGKILL)
            return
        self._note(f"got {signal.Signals(sig).name}; stopping the job")
        asyncio.get_running_loop().create_task(self._teardown(0.0))

    async def _wait_all(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while any(c.returncode is None for c in self.children) and loop.time() < end:
            await asyncio.sleep(0.05)

    def _kill_all(self, sig: int) -> None:
        for c in self.children:
            # the rank's whole session: also what a rank that exited left running
            if c.returncode is None or sig == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(c.pid, sig)

    async def _pump(self, rank: int, fd: int, out) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
        prefix = f"[rank{rank}]: ".encode() if self.opts.prefix else b""
        last = self._last_err.setdefault(rank, collections.deque(maxlen=8)) \
            if out is self._err else None
        log = None
        if self.opts.log_dir:
            os.makedirs(self.opts.log_dir, exist_ok=True)
            log = open(os.path.join(self.opts.log_dir, f"rank{rank}.log"), "ab")  # noqa: SIM115
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

    def _root_cause(self) -> tuple[int, int]:
        """(rank, exit code) of the failure the others followed: a rank killed by a
        signal, else the first whose last words were not about another rank's loss."""
        killed = [f for f in self._failures if f[1] < 0]
        if killed:
            return killed[0]
        own = [f for f in self._failures if b"PeerLostError" not in self._last_line(f[0])]
        return (own or self._failures)[0]

    def _last_line(self, rank: int) -> bytes:
        lines = self._last_err.get(rank) or ()
        return next((ln for ln in reversed(lines) if ln.strip()), b"")

    def summary(self) -> list[str]:
        """The closing lines of a failed job: who failed first and how, and the rest
        folded into one line."""
        if not self._failures:
            return []
        rank, code = self._root_cause()
        how = f"killed by {signal.Signals(-code).name}" if code < 0 and -code in \
            signal.Signals._value2member_map_ else f"exit code {code}"
        others = sorted({r for r, _ in self._failures if r != rank})
        lines = [f"job failed; first failure: rank {rank} ({how})"]
        last = self._last_line(rank).decode(errors="replace").strip()
        if last:
            lines.append(f"rank {rank}: {last}")
        if others:
            lines.append(f"rank(s) {_ranges(others)} then failed too (they lost rank {rank} "
                         "or were stopped)")
        return lines

    def _note(self, text: str) -> None:
        self._err.write(f"minidist run: {text}\n".encode())
        self._err.flush()


def _secret_from_file(path: str) -> str:
    """The job secret in ``path`` (its first line, stripped). ValueError if it is empty,
    or if the file is readable by group or others (a secret they could read)."""
    try:
        st = os.stat(path)
        with open(path) as f:
            secret = f.readline().strip()
    except OSError as e:
        raise ValueError(f"--secret-file {path}: {e.strerror}") from None
    if st.st_mode & 0o077:
        raise ValueError(f"--secret-file {path} has mode {st.st_mode & 0o777:o}: other "
                         f"users may read it; chmod 600 {path}")
    if not secret:
        raise ValueError(f"--secret-file {path} is empty")
    return secret


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 4, 6, 7] -> "0-2,4,6-7"."""
    out: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(out)


def die_with(parent: int) -> None:
    """In a new rank: be killed when the launcher ``parent`` dies (Linux's
    PR_SET_PDEATHSIG), so that a killed launcher leaves no rank behind."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: ranks notice the lost rendezvous instead
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _preload() -> None:
    """Import, once and before forking, what every rank would otherwise import itself."""
    import runpy  # noqa: F401
    import traceback  # noqa: F401

    import numpy  # noqa: F401

    from . import api, calibrate  # noqa: F401

    calibrate.load()  # read once here, not by every rank

    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401


def _run_target(opts: RunOptions, env: dict[str, str]) -> int:
    """In a forked rank: run the script or module as ``__main__``; return its exit code."""
    import atexit
    import runpy
    import traceback

    # what a fresh interpreter has: Ctrl-C raises KeyboardInterrupt, SIGTERM ends the
    # process, and a write to a closed socket raises an error instead of killing it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.environ.update(env)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    code = 0
    try:
        if opts.module:
            sys.argv = [opts.target, *opts.args]
            runpy.run_module(opts.target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [opts.target, *opts.args]
            sys.path[0] = os.path.dirname(os.path.abspath(opts.target))
            runpy.run_path(opts.target, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        code = 1
        try:
            sys.excepthook(*sys.exc_info())
        except Exception:
            traceback.print_exc()
    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    return code


def run(opts: RunOptions) -> int:
    """Run a job with the given options; return its exit code."""
    from .startup import configure_logging

    launcher = Launcher(opts)
    launcher.start_ranks()
    configure_logging("launcher")
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(launcher.run())
