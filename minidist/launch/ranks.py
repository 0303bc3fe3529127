"""Starting a rank's process for ``minidist run``: its environment, a fork of the
launcher (which imported numpy and minidist once: :func:`preload`) or a fresh process
(spawn), and what a forked rank runs (:func:`run_target`)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dis
import functools
import importlib
import io
import logging
import os
import signal
import socket
import subprocess
import sys
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NoReturn

from .options import RunOptions


@dataclass
class Child:
    """A rank's process as the launcher knows it."""

    rank: int
    pid: int
    err_fd: int  # the read end of its stderr's pipe (its stdout: the relay's one socket)
    popen: subprocess.Popen | None = None
    returncode: int | None = None
    exited: asyncio.Future | None = None  # done with the exit code (on the launcher's loop)


def rank_env(opts: RunOptions, port: int, secret: str, local_rank: int) -> dict[str, str]:
    """The variables a rank of this node finds in its environment (beside the
    launcher's own): the job's address and secret, its ranks, torchrun's names."""
    o = opts
    return {
        **o.env,
        "MINIDIST_LAUNCHER": "1",
        "MINIDIST_ADDR": o.master_addr,
        "MINIDIST_PORT": str(port),
        # torchrun's names too, so that torch code runs unchanged (torch.distributed's
        # "minidist" backend joins this job's rendezvous, opening no port of its own)
        "MASTER_ADDR": o.master_addr,
        "MASTER_PORT": str(port),
        "MINIDIST_SECRET": secret,
        "RANK": str(o.node_rank * o.nproc + local_rank),
        "WORLD_SIZE": str(o.nproc * o.nnodes),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(o.nproc),
        "GROUP_RANK": str(o.node_rank),
        "NODE_RANK": str(o.node_rank),
        "PYTHONUNBUFFERED": "1",
        # as torchrun does: N ranks of a node must not each start a thread per core
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or (
            "1" if o.nproc > 1 else str(os.cpu_count() or 1)),
    }


def spawn(opts: RunOptions, env: dict[str, str], stdout: int) -> subprocess.Popen:
    """Start a rank as a fresh process (``python -u`` the script or module, or
    ``opts.command``) in a session of its own, its stdout on the descriptor ``stdout``
    (the output relay's socket) and its stderr on a pipe; it dies with this process."""
    cmd = opts.command or [sys.executable, "-u", *(["-m"] if opts.module else []),
                           opts.target, *opts.args]
    launcher = os.getpid()
    return subprocess.Popen(cmd, env={**os.environ, **env},
                            stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: die_with(launcher))


def spawn_child(opts: RunOptions, rank: int, env: dict[str, str], stdout: int) -> Child:
    """:func:`spawn` rank ``rank``."""
    p = spawn(opts, env, stdout)
    return Child(rank, p.pid, p.stderr.fileno(), p)


def fork_children(opts: RunOptions, envs: list[tuple[int, dict[str, str]]],
                  started: list[Child], listeners: Iterable[socket.socket],
                  stdout: int, private: Iterable[int] = (),
                  code: types.CodeType | None = None) -> None:
    """Fork one rank for each ``(rank, environment)`` of ``envs`` from the launcher,
    before it runs an event loop or a thread, and add them to ``started`` (also those
    forked before an OSError). Each child closes the pipes of the ranks forked before
    it, the node's ``listeners`` and the launcher's ``private`` descriptors, makes
    ``stdout`` (the output relay's socket) its stdout, runs the target
    (:func:`run_target`; ``code``: the script, compiled by :func:`script_code`) and
    exits with its code.

    Between two forks the launcher does as little as it can: every page it writes
    there stays a private copy in the rank forked before (about 0.1 MiB a rank when
    the loop built each rank's environment and bookkeeping between the forks)."""
    launcher = os.getpid()
    _libc_prctl()
    signals = signals_to_reset()
    err_fds: list[int] = []
    pids: list[int] = []
    try:
        for _, env in envs:
            err_r, err_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                _become_rank(opts, env, launcher, err_fds, err_r, err_w, listeners,
                             stdout, private, code, signals)
            os.close(err_w)
            err_fds.append(err_r)
            pids.append(pid)
    finally:
        started.extend(Child(rank, pid, fd)
                       for (rank, _), pid, fd in zip(envs, pids, err_fds))


def _become_rank(opts: RunOptions, env: dict[str, str], launcher: int,
                 others: list[int], err_r: int, err_w: int,
                 listeners: Iterable[socket.socket], stdout: int, private: Iterable[int],
                 code: types.CodeType | None,
                 signals: list[tuple[int, object]]) -> NoReturn:
    """In a child just forked by :func:`fork_children`: become the rank; never returns."""
    status = 1
    try:
        os.setsid()
        die_with(launcher)
        for fd in others:
            os.close(fd)
        for s in listeners:
            s.close()
        for fd in private:
            os.close(fd)
        os.close(err_r)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdout, 1)
        os.dup2(err_w, 2)
        for fd in (devnull, stdout, err_w):
            if fd > 2:
                os.close(fd)
        status = run_target(opts, env, code, signals)
    finally:
        os._exit(status)


@functools.cache
def _libc_prctl():
    """libc's ``prctl`` (None where there is none), looked up once per process: by the
    launcher before it forks, so that no rank loads the library again."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with(parent: int) -> None:
    """In a new rank: be killed when the launcher ``parent`` dies (Linux's
    PR_SET_PDEATHSIG), so that a killed launcher leaves no rank behind."""
    prctl = _libc_prctl()
    if prctl is None:
        return  # not Linux: ranks notice the lost rendezvous instead
    prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def preload(heavy: Iterable[str] = (), threads: str | None = None) -> None:
    """Import, once and before forking, what every rank would otherwise import itself:
    numpy and minidist, and the ``heavy`` libraries the script imports at its top level
    (:func:`heavy_imports`), with ``OMP_NUM_THREADS`` set to ``threads`` (a rank's)
    while they load, as each rank would have it."""
    import runpy  # noqa: F401
    import traceback  # noqa: F401

    import numpy  # noqa: F401

    from .. import api, calibrate  # noqa: F401
    from ..algorithms import registry

    calibrate.load()  # read once here, not by every rank
    logging.getLogger("minidist")  # the package's logger made once, above its modules'
    registry.resolve_builtins()  # the algorithms' modules, imported once for all ranks

    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401
    before = os.environ.get("OMP_NUM_THREADS")
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = threads
    try:
        for name in heavy:
            with contextlib.suppress(Exception):  # the rank meets any error itself
                importlib.import_module(name)
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before


HEAVY = {"torch": ("torch", "minidist.torch")}  # a script's import -> what to preload


def heavy_imports(code: types.CodeType | None) -> list[str]:
    """The modules to preload for a script whose module-level ``code`` imports a heavy
    library (torch, or minidist.torch) at its top level; imports inside functions, and
    other libraries, are left to the ranks."""
    if code is None:
        return []
    found: list[str] = []
    last = ""
    for ins in dis.get_instructions(code):
        name = ""
        if ins.opname == "IMPORT_NAME":
            name = last = str(ins.argval)
        elif ins.opname == "IMPORT_FROM" and last == "minidist":
            name = f"minidist.{ins.argval}"
        for key, modules in HEAVY.items():
            if (name.split(".")[0] == key or name.startswith(f"minidist.{key}")) and \
                    modules[0] not in found:
                found.extend(modules)
    return found


def script_code(opts: RunOptions) -> types.CodeType | None:
    """The target script compiled once, in the launcher before it forks, so that its
    ranks share the compiled code's pages instead of each compiling its own; None for a
    module, a command, or a script that cannot be read or compiled (each rank then
    meets the error as ``python script.py`` would)."""
    if opts.module or opts.command:
        return None
    try:
        with io.open_code(opts.target) as f:
            return compile(f.read(), opts.target, "exec")
    except (OSError, SyntaxError, ValueError):
        return None


def run_script(opts: RunOptions, code: types.CodeType | None) -> None:
    """Run the script ``opts.target`` as ``python script.py`` would: in a new
    ``__main__`` module, the script's folder first on ``sys.path``; ``code``: the script
    compiled by the launcher (None: read and compiled here, by ``runpy``)."""
    import builtins
    import runpy

    sys.argv = [opts.target, *opts.args]
    sys.path[0] = os.path.dirname(os.path.abspath(opts.target))
    if code is None:
        runpy.run_path(opts.target, run_name="__main__")
        return
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=opts.target, __cached__=None, __loader__=None,
                         __package__=None, __spec__=None, __builtins__=builtins)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


# what a fresh interpreter has: Ctrl-C raises KeyboardInterrupt, SIGTERM ends the
# process, and a write to a closed socket raises an error instead of killing it
FRESH_SIGNALS = ((signal.SIGINT, signal.default_int_handler),
                 (signal.SIGTERM, signal.SIG_DFL), (signal.SIGPIPE, signal.SIG_IGN))


def signals_to_reset() -> list[tuple[int, object]]:
    """Those of :data:`FRESH_SIGNALS` this process does not handle as a fresh
    interpreter does: what a rank forked from it now must set (by the launcher before
    its fork loop, usually none: a rank then runs no code of the signal module)."""
    return [(sig, h) for sig, h in FRESH_SIGNALS if signal.getsignal(sig) != h]


@contextlib.contextmanager
def shared_environment(envs: list[tuple[int, dict[str, str]]]) -> Iterator[
        list[tuple[int, dict[str, str]]]]:
    """While forking the ranks of ``envs`` ((rank, its variables)): the variables
    that every rank has alike are this process's own, so that the ranks inherit them;
    yields each rank's remaining ones. Afterwards this process's environment is as it
    was. (Setting 20 variables costs a rank about 0.25 MiB of pages of its own.)"""
    common = dict(envs[0][1]) if envs else {}
    for _, env in envs[1:]:
        common = {k: v for k, v in common.items() if env.get(k) == v}
    before = {k: os.environ.get(k) for k in common}
    os.environ.update(common)
    try:
        yield [(rank, {k: v for k, v in env.items() if k not in common})
               for rank, env in envs]
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _fresh_stdio() -> None:
    """Line-buffered text streams on descriptors 0, 1 and 2, as the rank's script
    expects: the ones inherited from the launcher, reconfigured, when they are
    ordinary streams on those descriptors (no new stream objects, no encoding
    lookup); else new ones."""
    for name, fd, mode in (("stdout", 1, "w"), ("stderr", 2, "w"), ("stdin", 0, "r")):
        stream = getattr(sys, name)
        try:
            reuse = type(stream) is io.TextIOWrapper and stream.fileno() == fd and \
                not stream.closed and (mode == "r") != stream.writable()
        except (OSError, ValueError, AttributeError):
            reuse = False
        if reuse:
            if mode == "w":
                stream.reconfigure(line_buffering=True)
            continue
        setattr(sys, name, open(fd, mode, buffering=1 if mode == "w" else -1,  # noqa: SIM115
                                closefd=False))


def run_target(opts: RunOptions, env: dict[str, str],
               code: types.CodeType | None = None,
               signals: list[tuple[int, object]] | None = None) -> int:
    """In a forked rank: run the script (``code``, if the launcher compiled it) or
    module as ``__main__``; return its exit code. ``env``: the variables to set (those
    the launcher did not hand down already); ``signals``: the handlers to set (None:
    all of :data:`FRESH_SIGNALS`)."""
    import atexit
    import runpy
    import traceback

    for sig, handler in FRESH_SIGNALS if signals is None else signals:
        signal.signal(sig, handler)
    if env:
        os.environ.update(env)
    _fresh_stdio()
    status = 0
    try:
        if opts.module:
            sys.argv = [opts.target, *opts.args]
            runpy.run_module(opts.target, run_name="__main__", alter_sys=True)
        else:
            run_script(opts, code)
    except SystemExit as e:
        if e.code is None:
            status = 0
        elif isinstance(e.code, int):
            status = e.code
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:
        status = 1
        try:
            sys.excepthook(*sys.exc_info())
        except Exception:
            traceback.print_exc()
    try:
        atexit._run_exitfuncs()  # what the interpreter's exit would run (os._exit skips it)
    except BaseException:
        traceback.print_exc()
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    return status
