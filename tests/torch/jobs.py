"""Starting torch jobs for the tests: ``minidist run``, torchrun, or processes with a
torchrun-like environment; always cleaned up."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from ..processes.harness import ROOT, clean_env, kill_tree

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def free_port() -> int:
    """A TCP port that was free a moment ago (and whose successor also was)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of ports")


def torch_env(**extra: str) -> dict[str, str]:
    """A clean environment for a torch job: one thread per process (two cores here);
    ``extra`` may override the defaults (``MINIDIST_TIMEOUT="10"``)."""
    return clean_env(**{"OMP_NUM_THREADS": "1", "MINIDIST_TIMEOUT": "60", **extra})


def run_minidist(n: int, script: Path | str, *args: str, timeout: float = 150,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``minidist run -n N script args`` to the end (killed with its ranks on timeout)."""
    cmd = [sys.executable, "-m", "minidist", "run", "-n", str(n), str(script), *args]
    return _run(cmd, env or torch_env(), timeout)


def run_spawned(n: int, script: Path | str, *args: str, timeout: float = 150,
                env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess]:
    """``n`` fresh interpreters with the environment torchrun gives its workers
    (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    port = free_port()
    base = env or torch_env()
    procs = []
    try:
        for r in range(n):
            e = {**base, "RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
                 "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port)}
            procs.append(subprocess.Popen([sys.executable, str(script), *args], env=e,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, start_new_session=True, cwd=ROOT))
        results = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        return results
    finally:
        for p in procs:
            kill_tree(p)


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, cwd=ROOT)
    try:
        out, err = p.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)
    finally:
        kill_tree(p)


