"""The parent side of ``minidist bench``: one job of ``n`` processes per system.

* minidist: ``python -m minidist run -n N -m minidist.bench.worker --system minidist``;
* gloo: N processes ``python -m minidist.bench.worker --system gloo``, spawned here with
  torch's env:// variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, ...) and
  ``OMP_NUM_THREADS=1`` unless set, as torchrun would;
* mpi: ``mpirun -n N python -m minidist.bench.worker --system mpi``.

Every process starts in a session of its own. On a failure, a timeout or Ctrl-C, every
process tree is stopped: the tree is listed from /proc *before* any signal (a launcher
that dies first leaves orphans that no longer look like its children), then SIGTERM,
a grace period, then SIGKILL to everything listed and to every process still in one
of the listed sessions.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .report import Measurement
from .worker import MARK

ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the minidist package

# launcher variables that must not leak from our own environment into a job
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "GROUP_RANK", "NODE_RANK", "MINIDIST_LAUNCHER",
               "MINIDIST_PORT", "MINIDIST_ADDR", "MINIDIST_SECRET", "TORCHELASTIC_RUN_ID",
               "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID")
TERM_GRACE = 3.0


class BenchError(Exception):
    """A job that could not run or did not finish: ``short`` says why in one line, the
    message adds the last lines the job printed."""

    job: Job | None = None

    def __init__(self, short: str, tail: str = "") -> None:
        super().__init__(short + tail)
        self.short = short


# ----------------------------------------------------------------------------- processes


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, session id, start time) of every process, from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        # state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
        # stime cutime cstime priority nice num_threads itrealvalue starttime
        try:
            table[int(entry)] = (int(fields[1]), int(fields[3]), int(fields[19]))
        except (IndexError, ValueError):
            continue
    return table


def process_tree(root: int) -> dict[int, int]:
    """``root`` and all its descendants: pid -> start time (to tell a reused pid)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in out or pid not in table:
            continue
        out[pid] = table[pid][2]
        todo.extend(children.get(pid, ()))
    return out


def kill_trees(roots: list[int], grace: float = TERM_GRACE,
               wait: Callable[[float], bool] | None = None) -> None:
    """Stop every process under ``roots`` (see the module docstring); never our own."""
    me = {os.getpid(), os.getsid(0)}
    seen: dict[int, int] = {}
    for r in roots:
        seen.update(process_tree(r))
    table = _proc_table()
    sessions = {table[p][1] for p in seen if p in table} - me
    for pid in seen:
        if pid not in me:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
    if wait is not None:
        wait(grace)
    else:
        time.sleep(min(grace, 0.5))
    # SIGKILL what is left: the listed processes (not reused pids) and their sessions
    for r in roots:
        seen.update(process_tree(r))
    table = _proc_table()
    for pid, (_, sid, start) in table.items():
        if pid in me:
            continue
        if (pid in seen and seen[pid] == start) or sid in sessions:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@dataclass
class Job:
    """Processes of one system's job; rank 0's stdout carries the marked lines."""

    name: str
    commands: list[tuple[list[str], dict[str, str]]]
    on_event: Callable[[dict[str, Any]], None] | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)
    output: list[str] = field(default_factory=list)  # unmarked lines, for error reports
    events: list[dict[str, Any]] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for i, (cmd, env) in enumerate(self.commands):
            try:
                p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True, cwd=os.getcwd())
            except OSError as e:
                self.kill()
                raise BenchError(f"{self.name}: cannot start {cmd[0]}: {e}") from e
            self.procs.append(p)
            tag = f"[{i}] " if len(self.commands) > 1 else ""
            for stream, marked in ((p.stdout, i == 0), (p.stderr, False)):
                t = threading.Thread(target=self._read, args=(stream, tag, marked),
                                     daemon=True)
                t.start()
                self._threads.append(t)

    def _read(self, stream, tag: str, marked: bool) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            at = line.find(MARK) if marked else -1
            if at >= 0:
                try:
                    event = json.loads(line[at + len(MARK):])
                except json.JSONDecodeError:
                    event = None
                if event is not None:
                    with self._lock:
                        self.events.append(event)
                    if self.on_event is not None:
                        self.on_event(event)
                    continue
            with self._lock:
                self.output.append(tag + line)
                del self.output[:-200]
        stream.close()

    def _all_done(self) -> bool:
        codes = [p.poll() for p in self.procs]  # poll every one: it sets returncode
        return all(c is not None for c in codes)

    def _wait_all(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not self._all_done():
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)
        return True

    def wait(self, timeout: float) -> None:
        """Until every process exits 0; BenchError (after killing everything) otherwise."""
        end = time.monotonic() + timeout
        try:
            while not self._all_done():
                failed = [p for p in self.procs if p.returncode not in (None, 0)]
                if failed:
                    # let the others notice and report, then stop everything
                    self._wait_all(5.0)
                    self.kill()
                    raise BenchError(f"{self.name}: a process exited with code "
                                     f"{failed[0].returncode}", self._tail())
                if time.monotonic() >= end:
                    tail = self._tail(join=False)
                    self.kill()
                    raise BenchError(f"{self.name}: timed out after {timeout:g} s "
                                     f"(raise --timeout?)", tail)
                time.sleep(0.02)
        except BaseException:
            self.kill()
            raise
        bad = [p.returncode for p in self.procs if p.returncode != 0]
        self._join()
        if bad:
            self.kill()
            raise BenchError(f"{self.name}: a process exited with code {bad[0]}", self._tail())
        if not any(e.get("event") == "done" for e in self.events):
            self.kill()
            raise BenchError(f"{self.name}: the job ended without its results", self._tail())
        self.kill()  # anything a rank left behind

    def _join(self) -> None:
        for t in self._threads:
            t.join(timeout=2.0)

    def kill(self) -> None:
        if not self.procs:
            return
        kill_trees([p.pid for p in self.procs], wait=self._wait_all)
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=5)
        self._join()

    def _tail(self, lines: int = 25, join: bool = True) -> str:
        if join:
            self._join()
        with self._lock:
            tail = [ln for ln in self.output if ln.strip()][-lines:]
        return ("; its last output:\n  " + "\n  ".join(tail)) if tail else ""

    def measurements(self) -> dict[int, Measurement]:
        return {e["count"]: Measurement(e["time_us"], e.get("wrong"))
                for e in self.events if e.get("event") == "row"}

    def info(self) -> dict[str, Any]:
        for e in self.events:
            if e.get("event") == "start":
                return e.get("info", {})
        return {}


# ----------------------------------------------------------------------------- commands


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCH_VARS and not k.startswith(("OMPI_", "PMIX_"))}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_args(system: str, cfg: dict[str, Any]) -> list[str]:
    return ["-m", "minidist.bench.worker", "--system", system, "--config", json.dumps(cfg)]


def minidist_commands(cfg: dict[str, Any], timeout: float
                      ) -> list[tuple[list[str], dict[str, str]]]:
    extra = {"MINIDIST_TIMEOUT": str(int(timeout))}
    if cfg["collective"] == "barrier" and cfg.get("algorithm"):
        extra["MINIDIST_ALGO_BARRIER"] = cfg["algorithm"]
    if cfg.get("algo_modules"):  # algorithms of your own, imported by every rank
        extra["MINIDIST_ALGO_MODULE"] = ",".join(cfg["algo_modules"])
    cmd = [sys.executable, "-m", "minidist", "run", "-n", str(cfg["n"]), "-m",
           "minidist.bench.worker", "--system", "minidist", "--config", json.dumps(cfg)]
    return [(cmd, clean_env(**extra))]


def gloo_commands(cfg: dict[str, Any], timeout: float
                  ) -> list[tuple[list[str], dict[str, str]]]:
    n, port = cfg["n"], free_port()
    gloo_cfg = {**cfg, "algorithm": None}
    out = []
    for rank in range(n):
        env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                        WORLD_SIZE=str(n), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n),
                        MINIDIST_BENCH_TIMEOUT=str(int(timeout)))
        env.setdefault("OMP_NUM_THREADS", "1")
        out.append(([sys.executable, "-u", *worker_args("gloo", gloo_cfg)], env))
    return out


def mpi_commands(cfg: dict[str, Any], timeout: float
                 ) -> list[tuple[list[str], dict[str, str]]]:
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        raise BenchError("--vs mpi: mpirun is not on PATH (install Open MPI or MPICH)")
    cmd = [mpirun]
    if os.geteuid() == 0 and _is_open_mpi(mpirun):
        cmd.append("--allow-run-as-root")
    if _is_open_mpi(mpirun):
        cmd += ["--oversubscribe", "--bind-to", "none"]
    cmd += ["-n", str(cfg["n"]), sys.executable, "-u",
            *worker_args("mpi", {**cfg, "algorithm": None})]
    return [(cmd, clean_env())]


def _is_open_mpi(mpirun: str) -> bool:
    return "Open MPI" in mpi_version(mpirun)


def mpi_version(mpirun: str | None = None) -> str:
    mpirun = mpirun or shutil.which("mpirun") or shutil.which("mpiexec")
    if not mpirun:
        return ""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    first = (out.stdout or out.stderr).strip().splitlines()
    return first[0] if first else ""


COMMANDS = {"minidist": minidist_commands, "gloo": gloo_commands, "mpi": mpi_commands}


def missing(system: str) -> str | None:
    """Why ``system`` cannot run here (a message), or None."""
    import importlib.util

    if system == "gloo":
        if importlib.util.find_spec("torch") is None:
            return "--vs gloo needs torch, which is not installed (pip install torch)"
    elif system == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return ("--vs mpi needs mpi4py, which is not installed (install an MPI such as "
                    "Open MPI, e.g. apt-get install openmpi-bin libopenmpi-dev, then "
                    "pip install mpi4py)")
        if not (shutil.which("mpirun") or shutil.which("mpiexec")):
            return ("--vs mpi needs mpirun on PATH (install Open MPI, e.g. apt-get install "
                    "openmpi-bin)")
    return None


def run_system(system: str, cfg: dict[str, Any], timeout: float,
               on_event: Callable[[dict[str, Any]], None] | None = None) -> Job:
    """Run one system's job to the end; its Job (with the events) or BenchError."""
    # "minidist/ALGO": minidist running one algorithm (cfg["algorithm"])
    job = Job(system, COMMANDS[system.split("/", 1)[0]](cfg, timeout), on_event)
    try:
        job.start()
        job.wait(timeout)
    except BenchError as e:
        e.job = job
        raise
    except BaseException:  # Ctrl-C or SIGTERM, maybe while the ranks were starting
        job.kill()
        raise
    return job


# ----------------------------------------------------------------------------- machine


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def revision() -> str | None:
    """The git commit of the minidist being measured (+dirty if minidist/ has changes
    outside this benchmark tool)."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=10", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "minidist", ":!minidist/bench"],
                               capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (a busy shared machine shows here)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info(systems: list[str] | None = None) -> dict[str, Any]:
    """The machine and the versions that matter, read without importing torch."""
    info: dict[str, Any] = {"minidist": revision(), "cpus": os.cpu_count()}
    with contextlib.suppress(AttributeError, OSError):
        info["cpus"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["mem_gib"] = int(line.split()[1]) / (1 << 20)
                    break
    info["os"] = f"{platform.system()} {platform.release()}"
    info["python"] = platform.python_version()
    info["numpy"] = _version("numpy")
    info["torch"] = _version("torch")
    info["uvloop"] = _version("uvloop")
    info["load_before"] = load_average()
    if systems and "mpi" in systems:
        info["mpi4py"] = _version("mpi4py")
        info["mpi"] = mpi_version()
    return info
