"""Footprint of the RL layout: minidist beside torch.distributed + gloo, as the OS sees it.

For each N (processes on this one node) it runs

* minidist: ``python -m minidist run -n N examples/rl_groups.py ROUNDS`` (fork start),
* gloo (when torch is importable): ``python -m torch.distributed.run --standalone
  --nproc-per-node N examples/rl_groups_torch.py ROUNDS``,

with ``MINIDIST_TEST_GATE`` set, so that every rank stops after its collectives and
prints READY. While the job is held there, this script reads /proc (through
``minidist.diagnostics``, never minidist's own counters): the listening TCP ports and the
established TCP connections of the whole job (launcher + ranks), the sockets and file
descriptors of each rank, and each rank's memory (RSS, PSS, USS from smaps_rollup, peak
RSS from VmHWM). Then it releases the gate and waits for the job to exit. The setup time
is the one the job's rank 0 prints in its summary line.

Every run gets a wall-clock timeout; a failure (exit code, last error line), a timeout,
or a gloo run that would not fit in memory (estimated at ``--gloo-mib-per-proc`` MiB per
process against ``--mem-fraction`` of MemAvailable) is recorded as that run's result.
Each launcher starts in its own session, with oom_score_adj 1000 (inherited by its ranks)
so that an out-of-memory kill lands on the job, not on the rest of the machine; when a
run ends, its whole process tree is killed (the launcher's session, and every descendant
this script saw, in its session).

    python benchmarks/footprint.py                       # N = 64 .. 1024, both systems
    python benchmarks/footprint.py --sizes 64,128 --json out.json
    python benchmarks/footprint.py --systems minidist --sizes 1024

Memory mode (``--memory``): where each rank's memory goes. For each start method,
workload and N it runs ``python -m minidist run -n N --start-method M
benchmarks/footprint_rank.py WORKLOAD [--torch]`` (the same job machinery: own session,
oom_score_adj, gate, timeout of ``--timeout-base`` + ``--timeout-per-rank``·N seconds,
whole tree killed at the end) and, while the ranks hold at the gate, reads from /proc:

* per rank (the pids of the ``READY <pid>`` lines): PSS, USS, shared and RSS from
  smaps_rollup, and PSS and USS by mapping kind from smaps: interpreter (python binary,
  libpython), numpy / torch / other libraries (.so), python heap ([heap] and anonymous
  mappings), stack, /dev/shm by segment kind (inbox 0x1b0c, stash 0x57a5, a group's
  area; unlinked ones apart as ``(deleted)``), other; mean and max per rank, MiB;
* the node: ``Shmem`` of /proc/meminfo before the job and while it holds, and the
  blocks (st_blocks·512) of the job's ``/dev/shm/minidist-*`` files;
* the launcher: its PSS and its open file descriptors by type (total, and total / N).

The floor, in the same invocation for each N: N children forked from a parent that
imported numpy (and torch, with ``--torch``), read after ``--settle`` s, and a bare
``python -c "import numpy"`` (``import torch``); "over floor" is the ranks' mean PSS
less the forked children's. A run whose estimate (``--mib-per-rank``: 40 MiB, 160 with
torch) exceeds ``--mem-fraction`` of MemAvailable is skipped and recorded, as is a failed
run (with its error line); the script goes on.

    python benchmarks/footprint.py --memory --sizes 8,128 --workloads init,each,rl
    python benchmarks/footprint.py --memory --sizes 8 --workloads each --torch \\
        --start-methods fork,spawn --json out.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from minidist import diagnostics

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "MINIDIST_LAUNCHER", "MINIDIST_PORT", "MINIDIST_SECRET",
               "MINIDIST_TEST_GATE", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK",
               "OMPI_COMM_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "GROUP_RANK", "NODE_RANK")

SUMMARY = re.compile(r"N=(\d+) groups=3 setup=([\d.]+)s listening_tcp_ports=(\d+) "
                     r"tcp_connections_between_ranks=(\d+)")
ERROR_LINE = re.compile(r"(\w*(Error|Exception)\b.*|.*(address already in use|Too many open "
                        r"files|Cannot allocate memory|Killed|timed out|Timeout).*)",
                        re.IGNORECASE)
ROOT_CAUSES = ("address already in use", "too many open files", "cannot allocate memory",
               "connection refused", "connection reset")
TCP_TIME_WAIT = 0x06

MIB = 1024.0


# ----------------------------------------------------------------------------- helpers

def meminfo_kib(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def torch_version() -> str | None:
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def become_subreaper() -> None:
    """Orphans of a launcher that died reparent to us, so we can still find and kill them."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def first_to_go() -> None:
    """In the launcher, before exec: if memory runs out, the kernel kills this job's
    processes (they inherit the setting) rather than anyone else's."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")


def time_wait_sockets() -> int:
    n = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as f:
            next(f)
            n += sum(1 for line in f if int(line.split()[3], 16) == TCP_TIME_WAIT)
    return n


def wait_for_quiet_network(limit: int, timeout: float) -> int:
    """Let TIME_WAIT sockets of a previous run drain (they hold ephemeral ports)."""
    end = time.monotonic() + timeout
    n = time_wait_sockets()
    while n > limit and time.monotonic() < end:
        time.sleep(2.0)
        n = time_wait_sockets()
    return n


def cpu_idle_fraction(seconds: float = 1.0) -> float:
    """The fraction of CPU time spent idle over the next ``seconds`` (from /proc/stat)."""
    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    total0, idle0 = read()
    time.sleep(seconds)
    total1, idle1 = read()
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_for_idle_cpus(fraction: float, timeout: float) -> float:
    """Let the previous run's exit (and the kernel's clean-up after it) finish before
    timing the next setup; returns the idle fraction last seen."""
    end = time.monotonic() + timeout
    idle = cpu_idle_fraction()
    while idle < fraction and time.monotonic() < end:
        idle = cpu_idle_fraction()
    return idle


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"max": 0.0, "mean": 0.0}
    return {"max": float(max(values)), "mean": float(statistics.fmean(values))}


def baseline(code: str) -> dict[str, float] | None:
    """Memory (MiB) of a bare interpreter that ran ``code`` and then waits on stdin."""
    p = subprocess.Popen([sys.executable, "-c", f"{code}; import sys; print('ok', flush=True);"
                          " sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, env=clean_env())
    try:
        if p.stdout.readline().strip() != "ok":
            return None
        time.sleep(0.5)
        m = diagnostics.memory_kib(p.pid)
        return {k: v / MIB for k, v in m.items()}
    finally:
        with contextlib.suppress(Exception):
            p.communicate("", timeout=60)
        if p.poll() is None:
            p.kill()
            p.wait()


# ----------------------------------------------------------------------------- one run

class Run:
    """One job: started in its own session, watched, measured at the gate, torn down."""

    def __init__(self, system: str, n: int, cmd: list[str], env: dict[str, str],
                 timeout: float) -> None:
        self.system, self.n, self.cmd, self.env, self.timeout = system, n, cmd, env, timeout
        self.out: list[str] = []
        self.err: collections.deque[str] = collections.deque(maxlen=4000)
        self.errors: list[str] = []  # lines that look like errors (first 500)
        self.ready = 0
        self.lock = threading.Lock()
        self.seen: dict[int, float] = {}  # pid -> create_time of every descendant seen

    def _reader(self, stream, is_err: bool) -> None:
        for raw in stream:
            line = raw.rstrip("\n")
            with self.lock:
                if is_err:
                    self.err.append(line)
                else:
                    self.out.append(line)
                    # unbuffered ranks sharing one pipe can run lines together
                    self.ready += line.count("READY")
                if len(self.errors) < 500 and ERROR_LINE.search(line):
                    self.errors.append(line)

    def _track(self) -> list[psutil.Process]:
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            kids = []
        for p in kids:
            with contextlib.suppress(psutil.Error):
                self.seen.setdefault(p.pid, p.create_time())
        return kids

    def execute(self, gate: Path) -> dict:
        res: dict = {"system": self.system, "n": self.n, "command": " ".join(self.cmd)}
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, text=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True,
                                     errors="replace", preexec_fn=first_to_go)
        threads = [threading.Thread(target=self._reader, args=(self.proc.stdout, False),
                                    daemon=True),
                   threading.Thread(target=self._reader, args=(self.proc.stderr, True),
                                    daemon=True)]
        for t in threads:
            t.start()
        deadline = t0 + self.timeout
        held = 0.0
        try:
            last_track = 0.0
            while self.ready < self.n and self.proc.poll() is None \
                    and time.monotonic() < deadline:
                # rarely: walking /proc costs CPU that the job's setup would miss; ranks
                # orphaned meanwhile come to this script anyway (it is a subreaper)
                if time.monotonic() - last_track > 15.0:
                    self._track()
                    last_track = time.monotonic()
                time.sleep(0.1)
            if self.ready >= self.n and self.proc.poll() is None:
                t_ready = time.monotonic()
                res["seconds_to_ready"] = t_ready - t0
                res.update(self.measure())
                gate.touch()
                held = time.monotonic() - t_ready
            if self.proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(max(1.0, deadline - time.monotonic()))
            rc = self.proc.poll()
            t_end = time.monotonic()
            res["wall_seconds"] = t_end - t0 - held
            res["held_at_gate_seconds"] = held
            for t in threads:
                t.join(timeout=5)
            summary = next((m for m in map(SUMMARY.search, self.out) if m), None)
            if summary:
                res["setup_seconds"] = float(summary.group(2))
                res["summary_listening_tcp_ports"] = int(summary.group(3))
                res["summary_tcp_connections_between_ranks"] = int(summary.group(4))
            if rc is None:
                res["result"] = (f"timeout after {self.timeout:.0f} s "
                                 f"({min(self.ready, self.n)}/{self.n} ranks READY)")
                res["ready_ranks"] = self.ready
                if self.errors:
                    res["error"] = self.error_line()
            elif rc != 0:
                res["result"] = f"failed (exit {rc})"
                res["exit_code"] = rc
                res["error"] = self.error_line()
            elif "ranks" not in res:
                res["result"] = "finished without being measured"
                res["ready_ranks"] = self.ready
                res["stdout_tail"] = self.out[-20:]
                res["stderr_tail"] = list(self.err)[-20:]
            else:
                res["result"] = "ok"
            res["exit_code"] = rc
        finally:
            self.kill_tree()
        return res

    def error_line(self) -> str:
        with self.lock:
            lines = list(self.errors)
        for cause in ROOT_CAUSES:
            for line in lines:
                if cause in line.lower():
                    return line.strip()[:240]
        lines = [x for x in lines if "ChildFailedError" not in x and "Traceback" not in x]
        if lines:
            return lines[-1].strip()[:240]
        with self.lock:
            tail = [x for x in list(self.err) + self.out[-5:] if x.strip()]
        return tail[-1].strip()[:240] if tail else ""

    def measure(self) -> dict:
        launcher = psutil.Process(self.proc.pid)
        ranks = launcher.children(recursive=False)
        every = self._track()
        job = [self.proc.pid] + [p.pid for p in every]
        ports, conns = diagnostics.tcp_sockets(job)
        connections = {frozenset((local, remote)) for _, local, remote in conns}
        rank_pids = [p.pid for p in ranks]
        sockets = [diagnostics.socket_count(p) for p in rank_pids]
        fds = [diagnostics.fd_count(p) for p in rank_pids]
        mem = [diagnostics.memory_kib(p) for p in rank_pids]
        out = {
            "ranks": len(rank_pids),
            "job_processes": len(job),
            "listening_tcp_ports": len(ports),
            "tcp_connections": len(connections),
            "tcp_established_endpoints": len(conns),
            "sockets_per_rank": stats(sockets),
            "fds_per_rank": stats(fds),
            "launcher_sockets": diagnostics.socket_count(self.proc.pid),
            "launcher_memory_mib": {k: v / MIB for k, v in
                                    diagnostics.memory_kib(self.proc.pid).items()},
        }
        for key in ("rss", "pss", "uss", "hwm"):
            out[f"{key}_mib"] = stats([m[key] / MIB for m in mem])
        out["pss_total_mib"] = sum(m["pss"] for m in mem) / MIB
        return out

    def kill_tree(self) -> None:
        """SIGKILL the launcher's session and every descendant seen (each in its session)."""
        self._track()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid, created in list(self.seen.items()):
            try:
                if psutil.Process(pid).create_time() != created:
                    continue  # the pid was reused by someone else's process
            except psutil.NoSuchProcess:
                continue
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(30)
        end = time.monotonic() + 60
        pending = dict(self.seen)
        while pending and time.monotonic() < end:
            for pid, created in list(pending.items()):
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)  # orphans that reparented to us
                try:
                    p = psutil.Process(pid)
                    if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                        continue  # still dying
                except psutil.NoSuchProcess:
                    pass
                del pending[pid]
            if pending:
                time.sleep(0.2)


# ----------------------------------------------------------------------------- memory mode

RANK_SCRIPT = ROOT / "benchmarks" / "footprint_rank.py"
TORCH_RANK_SCRIPT = ROOT / "benchmarks" / "footprint_rank_torch.py"  # imports torch at its top
READY_PID = re.compile(r"READY (\d+)")
SHM_DIR = "/dev/shm"
SEGMENT = re.compile(r"minidist-(.+)-([0-9a-f]{16})-(\d+)$")
SEGMENT_KINDS = {0x1B0C: "inbox", 0x57A5: "stash"}  # the group field's top 16 bits
SO_FILE = re.compile(r"\.so(\.[\w.]*)?$")
NUMPY_LIB = re.compile(r"/site-packages/numpy(\.libs)?/")
TORCH_LIB = re.compile(r"/site-packages/(torch|torch\.libs|functorch|torchgen|nvidia)/")
INTERPRETER = {os.path.realpath(sys.executable), sys.executable}
KIND_ORDER = ("interpreter", "numpy libs", "torch libs", "other libs", "python heap",
              "stack", "/dev/shm inbox", "/dev/shm stash", "/dev/shm area",
              "/dev/shm inbox (deleted)", "/dev/shm stash (deleted)",
              "/dev/shm area (deleted)", "other")

# N children forked from a parent that imported numpy (and torch): each prints READY and
# sleeps until the gate file exists, as the ranks do; the parent reaps them
FLOOR_CODE = """
import os, sys, time
import numpy
if sys.argv[2] == "torch":
    import torch
gate = os.environ["MINIDIST_TEST_GATE"]
sys.stdout.flush()
kids = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        print(f"READY {os.getpid()}", flush=True)
        end = time.time() + 600
        while not os.path.exists(gate) and time.time() < end:
            time.sleep(0.1)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
"""


def segment_kind(name: str) -> str | None:
    """``inbox``, ``stash`` or ``area`` for a minidist segment name, else None."""
    m = SEGMENT.match(name)
    if not m:
        return None
    return SEGMENT_KINDS.get(int(m.group(2), 16) >> 48, "area")


def mapping_kind(path: str) -> str:
    """The kind of one smaps mapping, by its path (empty: anonymous)."""
    deleted = path.endswith(" (deleted)")
    if deleted:
        path = path[:-len(" (deleted)")]
    if not path or path == "[heap]" or path.startswith("[anon"):
        return "python heap"
    if path == "[stack]":
        return "stack"
    if path.startswith(SHM_DIR + "/"):
        kind = segment_kind(os.path.basename(path))
        if kind is None:
            return "other"
        return f"/dev/shm {kind}" + (" (deleted)" if deleted else "")
    base = os.path.basename(path)
    if path in INTERPRETER or base.startswith("libpython") or re.fullmatch(r"python[\d.]*",
                                                                            base):
        return "interpreter"
    if SO_FILE.search(base):
        if NUMPY_LIB.search(path):
            return "numpy libs"
        if TORCH_LIB.search(path):
            return "torch libs"
        return "other libs"
    return "other"


def smaps_rollup_kib(pid: int) -> dict[str, int]:
    """PSS, USS (private), shared and RSS of a process from smaps_rollup, in KiB."""
    fields: dict[str, int] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            value = rest.split()
            if value and value[0].isdigit():
                fields[key] = int(value[0])
    return {"pss": fields.get("Pss", 0), "rss": fields.get("Rss", 0),
            "uss": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
            "shared": fields.get("Shared_Clean", 0) + fields.get("Shared_Dirty", 0)}


def smaps_by_kind(pid: int) -> tuple[dict[str, dict[str, int]], set[str], list[str]]:
    """PSS and USS (KiB) of a process by mapping kind, from smaps; the minidist job names
    of the /dev/shm segments it maps; the address ranges of those already unlinked."""
    out: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"pss": 0, "uss": 0})
    jobs: set[str] = set()
    deleted: list[str] = []
    cur = None
    with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head, _, rest = line.partition(" ")
            if not head.endswith(":"):  # a mapping's first line: range perms off dev inode path
                parts = line.rstrip("\n").split(None, 5)
                path = parts[5].strip() if len(parts) > 5 else ""
                cur = out[mapping_kind(path)]
                if path.startswith(SHM_DIR + "/"):
                    m = SEGMENT.match(os.path.basename(path.removesuffix(" (deleted)")))
                    if m:
                        jobs.add(m.group(1))
                        if path.endswith(" (deleted)"):
                            deleted.append(parts[0])
            elif cur is not None and head in ("Pss:", "Private_Clean:", "Private_Dirty:"):
                kib = int(rest.split()[0])
                cur["pss" if head == "Pss:" else "uss"] += kib
    return dict(out), jobs, deleted


def unlinked_segments(mapped: list[tuple[int, str]]) -> dict[tuple[int, int], tuple[str, int]]:
    """(device, inode) -> (segment kind, bytes held) of unlinked segments that processes
    still map, given as (pid, address range): through /proc/<pid>/map_files."""
    found: dict[tuple[int, int], tuple[str, int]] = {}
    for pid, span in mapped:
        path = f"/proc/{pid}/map_files/{span}"
        try:
            st = os.stat(path)
            name = os.path.basename(os.readlink(path).removesuffix(" (deleted)"))
        except OSError:
            continue
        found[(st.st_dev, st.st_ino)] = (segment_kind(name) or "other", st.st_blocks * 512)
    return found


def shm_files(jobs: set[str], pids: set[int]) -> list[tuple[str, int]]:
    """(name, bytes held: st_blocks·512) of the /dev/shm/minidist-* files of the given
    jobs, or made by the given processes."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(SHM_DIR):
            if not entry.name.startswith("minidist-"):
                continue
            m = SEGMENT.match(entry.name)
            if m and (m.group(1) in jobs or int(m.group(3)) in pids):
                with contextlib.suppress(OSError):
                    found.append((entry.name, entry.stat().st_blocks * 512))
    return found


def fd_kinds(pid: int) -> dict[str, int]:
    """Open file descriptors of a process by type (pipe, socket, anon_inode:..., file)."""
    kinds: collections.Counter[str] = collections.Counter()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(("pipe:", "socket:")):
                kinds[target.split(":")[0]] += 1
            elif target.startswith("anon_inode:"):
                kinds["anon_inode:" + target.split(":", 1)[1].strip("[]")] += 1
            elif target.startswith("/dev/"):
                kinds["device"] += 1
            else:
                kinds["file"] += 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def mib_stats(values: list[float]) -> dict[str, float]:
    return stats([v / MIB for v in values])


class MemoryRun(Run):
    """A job whose processes print ``READY <pid>`` and hold at the gate: at the gate it
    reads their memory (and with ``detail`` the breakdown, /dev/shm, the launcher)."""

    def __init__(self, n: int, cmd: list[str], env: dict[str, str], timeout: float,
                 settle: float = 0.0, detail: bool = True) -> None:
        super().__init__("minidist", n, cmd, env, timeout)
        self.settle, self.detail = settle, detail
        self.shmem_before_kib = meminfo_kib("Shmem")
        self.jobs: set[str] = set()

    def ready_pids(self) -> list[int]:
        with self.lock:
            return [int(p) for line in self.out for p in READY_PID.findall(line)]

    def measure(self) -> dict:
        if self.settle:
            time.sleep(self.settle)
        pids = self.ready_pids()
        every = self._track()
        roll = [smaps_rollup_kib(p) for p in pids]
        out: dict = {"ranks": len(pids), "job_processes": 1 + len(every)}
        for key in ("pss", "uss", "shared", "rss"):
            out[f"{key}_mib"] = mib_stats([r[key] for r in roll])
        out["pss_total_mib"] = sum(r["pss"] for r in roll) / MIB
        launcher = smaps_rollup_kib(self.proc.pid)
        out["launcher_pss_mib"] = launcher["pss"] / MIB
        if not self.detail:
            return out
        kinds: dict[str, list[dict[str, int]]] = collections.defaultdict(list)
        unlinked: list[tuple[int, str]] = []
        for pid in pids:
            by_kind, jobs, deleted = smaps_by_kind(pid)
            self.jobs |= jobs
            unlinked += [(pid, span) for span in deleted]
            for kind in set(KIND_ORDER) | set(by_kind):
                kinds[kind].append(by_kind.get(kind, {"pss": 0, "uss": 0}))
        out["breakdown_mib"] = {
            kind: {"pss": mib_stats([k["pss"] for k in kinds[kind]]),
                   "uss": mib_stats([k["uss"] for k in kinds[kind]])}
            for kind in sorted(kinds, key=lambda k: (k not in KIND_ORDER,
                                                      KIND_ORDER.index(k)
                                                      if k in KIND_ORDER else 0, k))}
        shmem = meminfo_kib("Shmem")
        out["shmem_before_mib"] = self.shmem_before_kib / MIB
        out["shmem_held_mib"] = shmem / MIB
        out["shmem_delta_mib"] = (shmem - self.shmem_before_kib) / MIB
        files = shm_files(self.jobs, {self.proc.pid, *pids})
        by_seg: dict[str, list[int]] = collections.defaultdict(list)
        for name, size in files:
            by_seg[segment_kind(name) or "other"].append(size)
        out["dev_shm_files"] = len(files)
        out["dev_shm_mib"] = sum(size for _, size in files) / MIB / MIB
        out["dev_shm_by_kind"] = {k: {"files": len(v), "mib": sum(v) / MIB / MIB}
                                  for k, v in sorted(by_seg.items())}
        # segments already unlinked from /dev/shm (a group's area once set up) that the
        # ranks still map: they hold Shmem too, but no file in /dev/shm shows them
        gone: dict[str, list[int]] = collections.defaultdict(list)
        for kind, size in unlinked_segments(unlinked).values():
            gone[kind].append(size)
        out["unlinked_segments"] = sum(len(v) for v in gone.values())
        out["unlinked_segments_mib"] = sum(map(sum, gone.values())) / MIB / MIB
        out["unlinked_by_kind"] = {k: {"segments": len(v), "mib": sum(v) / MIB / MIB}
                                   for k, v in sorted(gone.items())}
        out["jobs"] = sorted(self.jobs)
        fds = fd_kinds(self.proc.pid)
        out["launcher_fds"] = sum(fds.values())
        out["launcher_fds_per_rank"] = out["launcher_fds"] / max(1, len(pids))
        out["launcher_fds_by_type"] = fds
        out["launcher_memory_mib"] = {k: v / MIB for k, v in launcher.items()}
        return out


def memory_guard(n: int, mib_per_rank: float, fraction: float) -> str | None:
    avail_mib = meminfo_kib("MemAvailable") / MIB
    need_mib = n * mib_per_rank
    if need_mib > fraction * avail_mib:
        return (f"skipped: needs ~{need_mib / 1024:.1f} GiB ({n} x {mib_per_rank:g} MiB > "
                f"{fraction:.0%} of MemAvailable, {avail_mib / 1024:.1f} GiB)")
    return None


def floor_run(n: int, use_torch: bool, args, log) -> dict:
    """N children forked from a parent that imported numpy (and torch): their memory."""
    res: dict = {"n": n, "torch": use_torch}
    skip = memory_guard(n, args.mib_per_rank, args.mem_fraction)
    if skip:
        return {**res, "result": skip}
    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        env = clean_env(MINIDIST_TEST_GATE=str(Path(tmp) / "gate"), OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-c", FLOOR_CODE, str(n), "torch" if use_torch else "numpy"]
        run = MemoryRun(n, cmd, env, args.timeout_base + args.timeout_per_rank * n,
                        settle=args.settle, detail=False)
        log(f"[footprint] floor N={n}{' torch' if use_torch else ''}: fork from a parent")
        got = run.execute(Path(tmp) / "gate")
    got.pop("command", None)
    got.pop("system", None)
    return {**res, **got}


def memory_run(method: str, workload: str, n: int, use_torch: bool, args, log) -> dict:
    res: dict = {"start_method": method, "workload": workload, "torch": use_torch, "n": n}
    skip = memory_guard(n, args.mib_per_rank, args.mem_fraction)
    if skip:
        return {**res, "result": skip}
    cmd = [sys.executable, "-m", "minidist", "run", "-n", str(n), "--start-method", method,
           str(TORCH_RANK_SCRIPT if use_torch else RANK_SCRIPT), workload,
           *(["--torch"] if use_torch else [])]
    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        gate = Path(tmp) / "gate"
        run = MemoryRun(n, cmd, clean_env(MINIDIST_TEST_GATE=str(gate)),
                        args.timeout_base + args.timeout_per_rank * n)
        log(f"[footprint] {method} {workload}{' torch' if use_torch else ''} N={n}: "
            f"{' '.join(cmd)}")
        got = run.execute(gate)
    got.pop("system", None)
    res.update(got)
    # what the job left behind (after its whole tree is gone): recorded, then removed
    left = [name for name, _ in shm_files(run.jobs, set(run.seen) | {run.proc.pid})]
    res["leftover_shm_files"] = left
    for name in left:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, name))
    alive = [pid for pid, created in run.seen.items() if _alive(pid, created)]
    if alive:
        res["leftover_processes"] = alive
    return res


def _alive(pid: int, created: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def memory_table(results: list[dict]) -> str:
    head = ("| start | workload | torch | N | result | PSS MiB mean / max | USS MiB mean "
            "| over floor MiB | Shmem Δ MiB | /dev/shm files MiB | launcher fds / rank "
            "| s |")
    return markdown(head, [[
        r["start_method"], r["workload"], "yes" if r["torch"] else "no", str(r["n"]),
        outcome(r), pair(r, "pss_mib"), fmt(r, "uss_mib", "mean"),
        fmt(r, "pss_over_floor_mib"), fmt(r, "shmem_delta_mib"), fmt(r, "dev_shm_mib"),
        fmt(r, "launcher_fds_per_rank"), fmt(r, "wall_seconds")] for r in results])


def memory_breakdown(r: dict) -> list[str]:
    """A few lines on where one run's memory goes."""
    name = (f"{r['start_method']} {r['workload']}{' torch' if r['torch'] else ''} "
            f"N={r['n']}")
    if "breakdown_mib" not in r:
        return [f"{name}: {r['result']}" + (f": {r['error']}" if r.get("error") else "")]
    lines = [f"{name}: rank PSS {r['pss_mib']['mean']:.1f} (max {r['pss_mib']['max']:.1f})"
             f", USS {r['uss_mib']['mean']:.1f}, shared {r['shared_mib']['mean']:.1f}, "
             f"RSS {r['rss_mib']['mean']:.1f} MiB mean"]
    for key in ("pss", "uss"):
        parts = [f"{kind} {v[key]['mean']:.2f}/{v[key]['max']:.2f}"
                 for kind, v in r["breakdown_mib"].items() if v[key]["max"] >= 0.005]
        lines.append(f"  {key.upper()} by kind, mean/max MiB: " + ", ".join(parts))
    segs = ", ".join(f"{k} {v['files']} = {v['mib']:.1f} MiB"
                     for k, v in r["dev_shm_by_kind"].items())
    lines.append(f"  node: Shmem {r['shmem_before_mib']:.1f} -> {r['shmem_held_mib']:.1f} "
                 f"MiB (delta {r['shmem_delta_mib']:.1f}); /dev/shm files "
                 f"{r['dev_shm_files']} = {r['dev_shm_mib']:.1f} MiB ({segs or 'none'}); "
                 f"unlinked but mapped {r['unlinked_segments']} = "
                 f"{r['unlinked_segments_mib']:.1f} MiB")
    fds = ", ".join(f"{k} {v}" for k, v in r["launcher_fds_by_type"].items())
    lines.append(f"  launcher: PSS {r['launcher_pss_mib']:.1f} MiB, {r['launcher_fds']} fds "
                 f"({fds}) = {r['launcher_fds_per_rank']:.2f} per rank")
    if "floor_pss_mib" in r:
        lines.append(f"  floor (forked, N={r['n']}): PSS {r['floor_pss_mib']:.1f}, USS "
                     f"{r['floor_uss_mib']:.1f} MiB mean; over floor "
                     f"{r['pss_over_floor_mib']:+.1f} MiB")
    if r.get("leftover_shm_files") or r.get("leftover_processes"):
        lines.append(f"  LEFT BEHIND: {len(r.get('leftover_shm_files', []))} /dev/shm files "
                     f"(removed), processes {r.get('leftover_processes', [])}")
    return lines


def memory_main(args, machine: dict, log) -> int:
    sizes = [int(s) for s in (args.sizes or "8,32,128").split(",") if s]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    methods = [m.strip() for m in args.start_methods.split(",") if m.strip()]
    for bad in [w for w in workloads if w not in ("init", "each", "rl")] + \
            [m for m in methods if m not in ("fork", "spawn")]:
        raise SystemExit(f"unknown workload or start method {bad!r}")
    use_torch = args.torch
    if use_torch and machine["torch"] is None:
        raise SystemExit("--torch: torch is not importable")
    if args.mib_per_rank is None:
        args.mib_per_rank = 160.0 if use_torch else 40.0
    module = "torch" if use_torch else "numpy"
    bare = baseline(f"import {module}")
    if bare:
        print(f"bare `python -c \"import {module}\"`: PSS {bare['pss']:.1f} MiB, USS "
              f"{bare['uss']:.1f} MiB, RSS {bare['rss']:.1f} MiB", flush=True)
    floors: dict[int, dict] = {}
    results: list[dict] = []

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"mode": "memory", "machine": machine, "bare_mib": {module: bare},
                 "floors": list(floors.values()), "results": results}, indent=1))

    for n in sizes:
        floors[n] = floor_run(n, use_torch, args, log)
        f = floors[n]
        log(f"[footprint] floor N={n}: {f['result']} {f.get('error', '')}")
        if "pss_mib" in f:
            print(f"floor N={n}: {n} children forked from a parent that imported {module}: "
                  f"PSS {f['pss_mib']['mean']:.1f} MiB mean, USS {f['uss_mib']['mean']:.1f}"
                  f" MiB mean", flush=True)
        save()
        for method in methods:
            for workload in workloads:
                res = memory_run(method, workload, n, use_torch, args, log)
                if "pss_mib" in res and "pss_mib" in f:
                    res["floor_pss_mib"] = f["pss_mib"]["mean"]
                    res["floor_uss_mib"] = f["uss_mib"]["mean"]
                    res["pss_over_floor_mib"] = res["pss_mib"]["mean"] - f["pss_mib"]["mean"]
                if bare:
                    res["bare_pss_mib"] = bare["pss"]
                log(f"[footprint] {method} {workload}{' torch' if use_torch else ''} N={n}: "
                    f"{res['result']} "
                    f"{res.get('error', '')} wall={res.get('wall_seconds')}")
                results.append(res)
                save()
    results.sort(key=lambda r: (methods.index(r["start_method"]),
                                workloads.index(r["workload"]), r["n"]))
    save()
    print()
    print(memory_table(results), flush=True)
    for r in results:
        print()
        print("\n".join(memory_breakdown(r)), flush=True)
    return 0


# ----------------------------------------------------------------------------- driver

def minidist_cmd(n: int, rounds: int) -> list[str]:
    return [sys.executable, "-m", "minidist", "run", "-n", str(n),
            str(EXAMPLES / "rl_groups.py"), str(rounds)]


def gloo_cmd(n: int, rounds: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(n), str(EXAMPLES / "rl_groups_torch.py"), str(rounds)]


def run_one(system: str, n: int, args, log) -> dict:
    if system == "gloo":
        avail_mib = meminfo_kib("MemAvailable") / MIB
        need_mib = n * args.gloo_mib_per_proc
        if need_mib > args.mem_fraction * avail_mib:
            return {"system": system, "n": n,
                    "result": f"skipped: needs ~{need_mib / 1024:.1f} GiB",
                    "detail": f"{n} x {args.gloo_mib_per_proc:g} MiB > "
                              f"{args.mem_fraction:.0%} of MemAvailable "
                              f"({avail_mib / 1024:.1f} GiB)"}
    tw = wait_for_quiet_network(args.time_wait_limit, 120.0)
    idle = wait_for_idle_cpus(args.idle_fraction, 60.0)
    avail_gib = meminfo_kib("MemAvailable") / MIB / MIB
    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        gate = Path(tmp) / "gate"
        env = clean_env(MINIDIST_TEST_GATE=str(gate))
        if system == "minidist":
            run = Run(system, n, minidist_cmd(n, args.rounds), env, args.timeout_minidist)
        else:
            run = Run(system, n, gloo_cmd(n, args.rounds), env, args.timeout_gloo)
        log(f"[footprint] {system} N={n}: {' '.join(run.cmd)}")
        res = run.execute(gate)
    res["time_wait_sockets_at_start"] = tw
    res["cpu_idle_fraction_at_start"] = idle
    res["mem_available_gib_at_start"] = avail_gib
    return res


def fmt(res: dict, key: str, sub: str | None = None, digits: int = 1) -> str:
    v = res.get(key)
    if v is None:
        return "–"
    if sub is not None:
        v = v.get(sub)
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def pair(res: dict, key: str, digits: int = 1) -> str:
    if key not in res:
        return "–"
    return f"{fmt(res, key, 'mean', digits)} / {fmt(res, key, 'max', digits)}"


def markdown(head: str, rows: list[list[str]]) -> str:
    """A markdown table: ``head`` (its titles between |) and each row's cells."""
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def outcome(r: dict) -> str:
    """A run's result cell: its result and its error, if any (| escaped)."""
    result = r["result"] + (f": {r['error']}" if r.get("error") else "")
    return result.replace("|", "\\|")


def table(results: list[dict]) -> str:
    head = ("| system | N | result | setup s | listening TCP ports | TCP conns "
            "| sockets/rank mean / max | fds/rank mean / max | RSS MiB mean / max "
            "| PSS MiB mean / max | USS MiB mean / max | peak RSS MiB max | wall s |")
    return markdown(head, [[
        r["system"], str(r["n"]), outcome(r), fmt(r, "setup_seconds", digits=2),
        fmt(r, "listening_tcp_ports"), fmt(r, "tcp_connections"),
        pair(r, "sockets_per_rank"), pair(r, "fds_per_rank"),
        pair(r, "rss_mib"), pair(r, "pss_mib"), pair(r, "uss_mib"),
        fmt(r, "hwm_mib", "max"), fmt(r, "wall_seconds")] for r in results])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=None,
                    help="comma-separated process counts (default 64,128,256,512,1024; "
                         "with --memory 8,32,128)")
    ap.add_argument("--gloo-sizes", default=None,
                    help="process counts for gloo (default: --sizes; memory guard applies)")
    ap.add_argument("--systems", default="minidist,gloo",
                    help="minidist, gloo or both (gloo only when torch is importable)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of collectives (default 3)")
    ap.add_argument("--timeout-minidist", type=float, default=300.0)
    ap.add_argument("--timeout-gloo", type=float, default=600.0)
    ap.add_argument("--gloo-mib-per-proc", type=float, default=160.0,
                    help="memory guard: estimated MiB per torch process (default 160)")
    ap.add_argument("--mem-fraction", type=float, default=0.8,
                    help="memory guard: share of MemAvailable a gloo run (or a --memory "
                         "run) may need (0.8)")
    ap.add_argument("--time-wait-limit", type=int, default=2000,
                    help="before a run, wait (up to 120 s) until fewer TIME_WAIT sockets")
    ap.add_argument("--idle-fraction", type=float, default=0.8,
                    help="before each run, wait (up to 60 s) until the CPUs were this idle "
                         "over one second (default 0.8)")
    ap.add_argument("--json", metavar="FILE", help="also write every result as JSON")
    mem = ap.add_argument_group("memory mode")
    mem.add_argument("--memory", action="store_true",
                     help="where each rank's memory goes (benchmarks/footprint_rank.py jobs)")
    mem.add_argument("--workloads", default="init,each,rl",
                     help="footprint_rank.py workloads: init, each, rl (default all three)")
    mem.add_argument("--start-methods", default="fork", help="fork, spawn or both (fork)")
    mem.add_argument("--torch", action="store_true",
                     help="the ranks call minidist.torch (torch imported in each rank)")
    mem.add_argument("--mib-per-rank", type=float, default=None,
                     help="memory guard: estimated MiB per rank (40; 160 with --torch)")
    mem.add_argument("--timeout-base", type=float, default=120.0,
                     help="a run's timeout: this many seconds ... (120)")
    mem.add_argument("--timeout-per-rank", type=float, default=0.5,
                     help="... plus this many per rank (0.5)")
    mem.add_argument("--settle", type=float, default=1.0,
                     help="seconds the forked floor's children wait before being read (1)")
    args = ap.parse_args(argv)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    become_subreaper()
    if args.memory:
        tv = torch_version()
        import numpy

        machine = {
            "host": platform.node(),
            "arch": platform.machine(),
            "nproc": os.cpu_count(),
            "mem_total_gib": meminfo_kib("MemTotal") / MIB / MIB,
            "mem_available_gib": meminfo_kib("MemAvailable") / MIB / MIB,
            "python": platform.python_version(),
            "python_executable": os.path.realpath(sys.executable),
            "numpy": numpy.__version__,
            "torch": tv,
            "kernel": platform.release(),
            "git_commit": git("rev-parse", "HEAD"),
            "uncommitted_changes": bool(git("status", "--porcelain", "--", "minidist",
                                            "benchmarks")),
            "dev_shm_free_gib": os.statvfs(SHM_DIR).f_bavail
            * os.statvfs(SHM_DIR).f_frsize / 2**30,
        }
        print(f"machine: {machine['nproc']} CPUs, {machine['mem_total_gib']:.1f} GiB RAM "
              f"({machine['mem_available_gib']:.1f} GiB available), Python "
              f"{machine['python']}, numpy {machine['numpy']}, torch {tv or 'not installed'}"
              f", commit {machine['git_commit'][:10]}"
              f"{' + changes' if machine['uncommitted_changes'] else ''}", flush=True)
        return memory_main(args, machine, log)
    args.sizes = args.sizes or "64,128,256,512,1024"
    sizes = [int(s) for s in args.sizes.split(",") if s]
    gloo_sizes = [int(s) for s in (args.gloo_sizes or args.sizes).split(",") if s]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    tv = torch_version()
    if "gloo" in systems and tv is None:
        log("[footprint] torch is not importable: gloo runs skipped")
        systems.remove("gloo")
    import numpy

    machine = {
        "nproc": os.cpu_count(),
        "mem_total_gib": meminfo_kib("MemTotal") / MIB / MIB,
        "mem_available_gib": meminfo_kib("MemAvailable") / MIB / MIB,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": tv,
        "kernel": platform.release(),
        "minidist_commit": git("rev-parse", "--short", "HEAD"),
        "minidist_uncommitted_changes": bool(git("status", "--porcelain", "--", "minidist")),
        "ephemeral_ports": open("/proc/sys/net/ipv4/ip_local_port_range").read().split(),
        "nofile_limit": __import__("resource").getrlimit(
            __import__("resource").RLIMIT_NOFILE)[0],
    }
    base = {"numpy": baseline("import numpy")}
    if tv is not None:
        base["torch"] = baseline("import torch")
    print(f"machine: {machine['nproc']} CPUs, {machine['mem_total_gib']:.1f} GiB RAM "
          f"({machine['mem_available_gib']:.1f} GiB available), Python {machine['python']}, "
          f"numpy {machine['numpy']}, torch {tv or 'not installed'}", flush=True)
    for name, b in base.items():
        if b:
            print(f"baseline `python -c \"import {name}\"`: RSS {b['rss']:.1f} MiB, "
                  f"PSS {b['pss']:.1f} MiB, USS {b['uss']:.1f} MiB", flush=True)

    results: list[dict] = []
    for n in sizes:
        for system in systems:
            if system == "gloo" and n not in gloo_sizes:
                continue
            res = run_one(system, n, args, log)
            log(f"[footprint] {system} N={n}: {res['result']} {res.get('error', '')}"
                f" setup={res.get('setup_seconds')} wall={res.get('wall_seconds')}")
            results.append(res)
            if args.json:
                Path(args.json).write_text(json.dumps(
                    {"machine": machine, "baseline_mib": base, "results": results}, indent=1))
    print()
    print(table(results), flush=True)
    skipped = [r for r in results if r.get("detail")]
    for r in skipped:
        print(f"\n{r['system']} N={r['n']} {r['result']} ({r['detail']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
