"""Running the native tests' multi-process jobs (``minidist run``), always cleaned up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ..processes.harness import ROOT, clean_env, kill_tree

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def env(**extra: str) -> dict[str, str]:
    """A clean environment: one thread per process, short timeouts, NCCL's bootstrap on
    the loopback interface (where a libnccl is installed and a test makes a unique id)."""
    return clean_env(**{"OMP_NUM_THREADS": "1", "MINIDIST_TIMEOUT": "60",
                        "NCCL_SOCKET_IFNAME": "lo", **extra})


def run(n: int, script: str, *args: str, timeout: float = 120,
        extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``minidist run -n N scripts/<script> args`` to its end (killed on timeout)."""
    cmd = [sys.executable, "-m", "minidist", "run", "-n", str(n), str(SCRIPTS / script),
           *args]
    p = subprocess.Popen(cmd, env=env(**(extra_env or {})), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         cwd=ROOT)
    try:
        out, err = p.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)
    finally:
        kill_tree(p)


def python(code: str, timeout: float = 60,
           extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -c code`` in a fresh interpreter (for what must not touch pytest's own
    process: NCCL threads, import checks)."""
    p = subprocess.Popen([sys.executable, "-c", code], env=env(**(extra_env or {})),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, cwd=ROOT)
    try:
        out, err = p.communicate(timeout=timeout)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)
    finally:
        kill_tree(p)


def lines(out: str, prefix: str) -> list[str]:
    """The payloads of the output lines that carry ``prefix`` (after ``[rankK]: ``)."""
    got = []
    for line in out.splitlines():
        i = line.find(prefix)
        if i >= 0:
            got.append(line[i + len(prefix):].strip())
    return got
