"""Starting jobs in subprocesses and always cleaning them up."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "MINIDIST_LAUNCHER", "MINIDIST_PORT", "MINIDIST_SECRET",
               "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
               "TORCHELASTIC_RUN_ID")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


class Job:
    """``minidist run`` in its own session; killed with everything under it on exit."""

    def __init__(self, n: int, script: str | Path, *args: str, env: dict | None = None,
                 launcher_args: tuple[str, ...] = ()) -> None:
        cmd = [sys.executable, "-m", "minidist", "run", "-n", str(n), *launcher_args,
               str(script), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env or clean_env(), start_new_session=True, text=True)
        self.ps = psutil.Process(self.proc.pid)
        self.out = ""
        self.err = ""

    def tree(self) -> list[psutil.Process]:
        try:
            return [self.ps, *self.ps.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def read_until(self, predicate, timeout: float) -> list[str]:
        """Read stdout lines until predicate(lines) holds (AssertionError after timeout)."""
        lines: list[str] = []
        end = time.monotonic() + timeout
        os.set_blocking(self.proc.stdout.fileno(), False)
        while not predicate(lines):
            if time.monotonic() > end:
                raise AssertionError(f"timed out; output so far: {lines}")
            chunk = self.proc.stdout.readline()
            if chunk:
                lines.append(chunk.rstrip("\n"))
            elif self.proc.poll() is not None:
                raise AssertionError(f"job ended early ({self.proc.returncode}): {lines}")
            else:
                time.sleep(0.02)
        self.out += "\n".join(lines) + "\n"
        return lines

    def wait(self, timeout: float) -> int:
        os.set_blocking(self.proc.stdout.fileno(), True)
        out, err = self.proc.communicate(timeout=timeout)
        self.out += out
        self.err += err
        return self.proc.returncode

    def kill(self) -> None:
        procs = self.tree()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.communicate(timeout=10)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def tcp_sockets(procs: list[psutil.Process]) -> tuple[list, list]:
    """(listening TCP sockets, established TCP connections) of these processes, from the OS."""
    listening, established = [], []
    for p in procs:
        try:
            conns = p.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                listening.append((p.pid, c.laddr))
            elif c.status == psutil.CONN_ESTABLISHED:
                established.append((p.pid, c.laddr, c.raddr))
    return listening, established


def unix_sockets(p: psutil.Process) -> int:
    try:
        return len(p.net_connections(kind="unix"))
    except psutil.NoSuchProcess:
        return 0


def kill_tree(p: subprocess.Popen) -> None:
    """Kill ``p`` and everything under it (ranks may run in sessions of their own)."""
    try:
        tree = [p.pid, *(c.pid for c in psutil.Process(p.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        tree = [p.pid]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        p.communicate(timeout=10)
