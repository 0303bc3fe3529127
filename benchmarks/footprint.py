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


def table(results: list[dict]) -> str:
    head = ("| system | N | result | setup s | listening TCP ports | TCP conns "
            "| sockets/rank mean / max | fds/rank mean / max | RSS MiB mean / max "
            "| PSS MiB mean / max | USS MiB mean / max | peak RSS MiB max | wall s |")
    rows = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in results:
        result = r["result"]
        if r.get("error"):
            result += f": {r['error']}"
        result = result.replace("|", "\\|")
        rows.append("| " + " | ".join([
            r["system"], str(r["n"]), result, fmt(r, "setup_seconds", digits=2),
            fmt(r, "listening_tcp_ports"), fmt(r, "tcp_connections"),
            pair(r, "sockets_per_rank"), pair(r, "fds_per_rank"),
            pair(r, "rss_mib"), pair(r, "pss_mib"), pair(r, "uss_mib"),
            fmt(r, "hwm_mib", "max"), fmt(r, "wall_seconds")]) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64,128,256,512,1024",
                    help="comma-separated process counts (default 64,128,256,512,1024)")
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
                    help="memory guard: share of MemAvailable a gloo run may need (0.8)")
    ap.add_argument("--time-wait-limit", type=int, default=2000,
                    help="before a run, wait (up to 120 s) until fewer TIME_WAIT sockets")
    ap.add_argument("--idle-fraction", type=float, default=0.8,
                    help="before each run, wait (up to 60 s) until the CPUs were this idle "
                         "over one second (default 0.8)")
    ap.add_argument("--json", metavar="FILE", help="also write every result as JSON")
    args = ap.parse_args(argv)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    become_subreaper()
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
