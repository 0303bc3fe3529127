"""Cross-host all_reduce bandwidth over emulated hosts, beside one plain TCP stream.

Builds two emulated hosts (network namespaces joined by veth pairs to a bridge, from
``tests/multinode/netns.py``; needs root and iproute2) and, in one invocation, measures

* **TCP**: one plain TCP stream from host 0 to host 1 (a Python sender doing
  ``sock.sendall`` of a preallocated buffer, a receiver doing ``sock.recv_into``) for a
  few seconds; also two streams at once in opposite directions (an all_reduce moves
  data both ways at the same time), reported per direction;
* **minidist**: ``all_reduce`` (SUM) of a float32 vector (16 MiB by default) with P
  processes per host, launched on each host as

      ip netns exec HOST python -m minidist run --nnodes 2 --node-rank K \\
          --master-addr ADDR0 --master-port PORT -n P benchmarks/multinode_bandwidth.py \\
          --worker ...

  Each job warms up, then times several blocks of iterations. The slowest rank's time
  of a block counts (an all_reduce ends when every rank has its result).

For each row the table gives the median over all blocks of all repeats:

* ``algbw = S / t`` (S: bytes of the vector, t: seconds per all_reduce);
* ``busbw = algbw * 2(n-1)/n`` with n = all ranks of the job, as nccl-tests defines it;
* ``link``: bytes per second that cross the link in each direction, counted by the
  kernel on host 0's veth interface during the timed blocks (tx and rx averaged;
  TCP/IP headers included), next to what the schedule itself sends across
  (``sched``, bytes of payload per call per direction, from ``make_schedule``);
* ``busbw / TCP``: the ratio to the single plain TCP stream.

With one process per host n = 2, so busbw = algbw and every byte of busbw crosses the
link. With P > 1 per host the hierarchical algorithm reduces inside each host first and
only the two hosts' leaders cross the link (S bytes each way per call); busbw counts
2(n-1)/n * S per rank, so it can exceed what the link carries: compare ``link`` with
the TCP stream for the link's own use.

Every process this script starts lives in its own session and in one of its own
namespaces; all of them are killed, and the namespaces deleted, however the run ends.

    sudo python benchmarks/multinode_bandwidth.py
    sudo python benchmarks/multinode_bandwidth.py --procs 1,2,4 --repeats 3 --json out.json
    sudo python benchmarks/multinode_bandwidth.py --algorithms auto,ring --procs 1
    sudo python benchmarks/multinode_bandwidth.py --algorithms auto,ring --wait-quiet 300

(``--wait-quiet`` waits before each measurement for the machine to go idle: on a
shared machine other people's jobs otherwise halve the figures.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()
MARK = "MDBW "
TCP_PORT = 29870
MINIDIST_PORT = 29700
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "MINIDIST_LAUNCHER", "MINIDIST_PORT", "MINIDIST_SECRET",
               "MINIDIST_ADDR", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK",
               "OMPI_COMM_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "GROUP_RANK", "NODE_RANK",
               "MINIDIST_ALGO_ALL_REDUCE")


# ---------------------------------------------------------------------------------------
# inside the namespaces: TCP sender / receiver, and the minidist worker


def _link_bytes() -> tuple[int, int]:
    """(rx, tx) bytes of this namespace's interfaces other than lo (/proc/net/dev is
    per network namespace)."""
    rx = tx = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, data = line.split(":", 1)
            if name.strip() == "lo":
                continue
            fields = data.split()
            rx += int(fields[0])
            tx += int(fields[8])
    return rx, tx


def tcp_recv(host: str, port: int, bufsize: int) -> int:
    """Accept one connection, read it to the end, print bytes and seconds."""
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, port))
    ls.listen(1)
    print("LISTENING", flush=True)
    conn, _ = ls.accept()
    buf = bytearray(bufsize)
    view = memoryview(buf)
    n = conn.recv_into(view)
    t0 = time.perf_counter()  # from the end of the first read: steady state
    total = 0
    while True:
        k = conn.recv_into(view)
        if k == 0:
            break
        total += k
    t1 = time.perf_counter()
    conn.close()
    ls.close()
    print(MARK + json.dumps({"bytes": total, "seconds": t1 - t0, "first": n}), flush=True)
    return 0


def tcp_send(host: str, port: int, bufsize: int, seconds: float) -> int:
    """Connect (retrying) and sendall a preallocated buffer for ``seconds``."""
    end = time.monotonic() + 30
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.connect((host, port))
            break
        except OSError:
            s.close()
            if time.monotonic() > end:
                raise
            time.sleep(0.05)
    buf = memoryview(bytearray(os.urandom(1 << 16)) * (bufsize >> 16))
    stop = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < stop:
        s.sendall(buf)
        sent += buf.nbytes
    s.shutdown(socket.SHUT_WR)
    s.close()
    print(MARK + json.dumps({"sent": sent}), flush=True)
    return 0


def worker(a: argparse.Namespace) -> int:
    """One rank of the all_reduce job (run under ``minidist run``)."""
    import numpy as np

    import minidist

    minidist.init(timeout=120)
    rank, n = minidist.get_rank(), minidist.get_world_size()
    count = a.bytes // 4
    x = np.full(count, float(rank + 1), np.float32)
    algo = None if a.algorithm == "auto" else a.algorithm
    for _ in range(a.warmup):
        minidist.all_reduce(x, algorithm=algo)
    # correctness once: every element is sum(r + 1) = n(n+1)/2 after a fresh fill
    x.fill(rank + 1)
    minidist.all_reduce(x, algorithm=algo)
    want = n * (n + 1) / 2
    if not (x[0] == want and x[-1] == want and x[count // 2] == want):
        print(f"WRONG RESULT on rank {rank}: {x[0]} {x[-1]} != {want}", flush=True)
        return 1
    blocks = []
    for _ in range(a.blocks):
        minidist.barrier()
        c0 = _link_bytes()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            minidist.all_reduce(x, algorithm=algo)
        t1 = time.perf_counter()
        c1 = _link_bytes()
        t = np.array([t1 - t0], np.float64)
        minidist.all_reduce(t, op=minidist.ReduceOp.MAX)
        blocks.append({"seconds": float(t[0]), "rx": c1[0] - c0[0], "tx": c1[1] - c0[1],
                       "mine": t1 - t0})
    if rank == 0:
        print(MARK + json.dumps({"world": n, "blocks": blocks, "iters": a.iters}),
              flush=True)
    minidist.destroy()
    return 0


# ---------------------------------------------------------------------------------------
# the driver: hosts, processes, cleanup, the table


def _load_hosts_class():
    sys.path.insert(0, str(ROOT))
    from tests.multinode.netns import Hosts, can_make_hosts

    return Hosts, can_make_hosts


class Procs:
    """Processes started in their own sessions; everything is killed on close()."""

    def __init__(self, hosts) -> None:
        self.hosts = hosts
        self.procs: list[subprocess.Popen] = []

    def start(self, host: int, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        p = subprocess.Popen([*self.hosts.prefix(host), *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def kill_all(self) -> None:
        # every process in our own namespaces (launchers, the ranks they forked into
        # sessions of their own, TCP helpers): only ours, since the names are unique
        pids: set[int] = set()
        for name in self.hosts.names:
            r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
            pids.update(int(x) for x in r.stdout.split())
        for p in self.procs:
            if p.poll() is None:
                pids.add(p.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.communicate(timeout=10)
        self.procs.clear()


def _communicate(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    """Wait for all, reading their pipes concurrently; TimeoutError after ``timeout``."""
    results: list = [None] * len(procs)

    def wait(i: int, p: subprocess.Popen) -> None:
        out, err = p.communicate()
        results[i] = (p.returncode, out, err)

    threads = [threading.Thread(target=wait, args=(i, p), daemon=True)
               for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"processes still running after {timeout:g} s")
    return results


def _marked(out: str) -> dict:
    for line in out.splitlines():
        i = line.find(MARK)
        if i >= 0:
            return json.loads(line[i + len(MARK):])
    raise RuntimeError(f"no result line in output: {out[-2000:]}")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def measure_tcp(ps: Procs, hosts, seconds: float, bufsize: int, both: bool) -> list[float]:
    """GB/s of each stream (host 0 -> 1, and with ``both`` also 1 -> 0 at the same time)."""
    pairs = [(0, 1)] + ([(1, 0)] if both else [])
    recvs, sends = [], []
    for k, (_src, dst) in enumerate(pairs):
        r = ps.start(dst, [sys.executable, str(THIS), "--tcp-recv", hosts.addrs[dst],
                           str(TCP_PORT + k), str(bufsize)], _env())
        line = r.stdout.readline()
        if "LISTENING" not in line:
            raise RuntimeError(f"TCP receiver did not start: {line} {r.stderr.read()[-2000:]}")
        recvs.append(r)
    for k, (src, dst) in enumerate(pairs):
        sends.append(ps.start(src, [sys.executable, str(THIS), "--tcp-send", hosts.addrs[dst],
                                    str(TCP_PORT + k), str(bufsize), str(seconds)], _env()))
    results = _communicate(recvs + sends, seconds + 60)
    for rc, _out, err in results:
        if rc != 0:
            raise RuntimeError(f"TCP helper failed: {err[-2000:]}")
    out = []
    for _rc, o, _ in results[:len(pairs)]:
        d = _marked(o)
        out.append(d["bytes"] / d["seconds"] / 1e9)
    ps.procs.clear()
    return out


def measure_minidist(ps: Procs, hosts, nproc: int, algorithm: str, a: argparse.Namespace,
                     port: int) -> dict:
    env = _env({"MINIDIST_SECRET": secrets.token_hex(16)})
    procs = []
    for k in range(2):
        cmd = [sys.executable, "-m", "minidist", "run", "--nnodes", "2", "--node-rank", str(k),
               "--master-addr", hosts.addrs[0], "--master-port", str(port), "-n", str(nproc),
               str(THIS), "--worker", "--bytes", str(a.bytes), "--iters", str(a.iters),
               "--warmup", str(a.warmup), "--blocks", str(a.blocks), "--algorithm", algorithm]
        procs.append(ps.start(k, cmd, env))
    results = _communicate(procs, a.job_timeout)
    for k, (rc, out, err) in enumerate(results):
        if rc != 0:
            raise RuntimeError(f"minidist job failed on host {k} (exit {rc}):\n"
                               f"{out[-2000:]}\n{err[-3000:]}")
    ps.procs.clear()
    return _marked(results[0][1])


def schedule_cross_bytes(nproc: int, algorithm: str, count: int) -> tuple[str, int]:
    """(the algorithm minidist runs, payload bytes host 0 sends across per call)."""
    sys.path.insert(0, str(ROOT))
    from minidist import algorithms

    n = 2 * nproc
    nodes = tuple(r // nproc for r in range(n))
    name = "hierarchical" if algorithm == "auto" else algorithm  # the group spans 2 nodes
    total = 0
    for r in range(nproc):  # the ranks of host 0
        s = algorithms.make_schedule("all_reduce", name, r, n, count, nodes=nodes, itemsize=4)
        for st in s.steps:
            for c in st.comms:
                if isinstance(c, algorithms.Send) and nodes[c.peer] != nodes[r]:
                    total += (c.hi - c.lo) * 4
    return name, total


def _code_state() -> str:
    """The commit and whether minidist/ has uncommitted changes (numbers depend on it)."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "minidist"],
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
        dirty = [line for line in dirty if line.strip()]
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}" + (f" + {len(dirty)} uncommitted change(s) under minidist/"
                                     if dirty else "")


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]  # total, idle + iowait


def wait_quiet(limit: float, idle_share: float = 0.9, seconds: int = 2) -> None:
    """Wait (up to ``limit`` s) until the machine has been at least ``idle_share`` idle
    for ``seconds`` seconds in a row: other people's jobs skew a CPU-bound benchmark."""
    if limit <= 0:
        return
    end = time.monotonic() + limit
    calm = 0
    while time.monotonic() < end:
        t0, i0 = _cpu_times()
        time.sleep(1)
        t1, i1 = _cpu_times()
        calm = calm + 1 if t1 > t0 and (i1 - i0) / (t1 - t0) >= idle_share else 0
        if calm >= seconds:
            return
    print(f"# the machine did not go quiet within {limit:g} s; measuring anyway", flush=True)


def _loadavg() -> str:
    with contextlib.suppress(OSError):
        return " ".join(open("/proc/loadavg").read().split()[:3])
    return "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=float, default=16.0, help="vector size (default 16)")
    p.add_argument("--procs", default="1,2,4", help="processes per host (default 1,2,4)")
    p.add_argument("--algorithms", default="auto",
                   help="all_reduce algorithms, comma-separated: auto (minidist's choice: "
                   "hierarchical across hosts), ring, ... (default auto)")
    p.add_argument("--repeats", type=int, default=3, help="jobs (and TCP runs) per row")
    p.add_argument("--iters", type=int, default=20, help="all_reduces per timed block")
    p.add_argument("--blocks", type=int, default=3, help="timed blocks per job")
    p.add_argument("--warmup", type=int, default=5, help="untimed all_reduces first")
    p.add_argument("--tcp-seconds", type=float, default=3.0, help="length of a TCP run")
    p.add_argument("--tcp-buffer-mib", type=int, default=16, help="sendall/recv_into size")
    p.add_argument("--job-timeout", type=float, default=300.0)
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="before each measurement wait (up to SECONDS) for the machine to "
                   "be 90%% idle for 2 s; for shared machines (default 0: do not wait)")
    p.add_argument("--json", help="also write the results to this file")
    # internal modes (run inside the namespaces)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--bytes", type=int, default=16 << 20, help=argparse.SUPPRESS)
    p.add_argument("--algorithm", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--tcp-recv", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--tcp-send", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.worker:
        return worker(a)
    if a.tcp_recv:
        return tcp_recv(a.tcp_recv[0], int(a.tcp_recv[1]), int(a.tcp_recv[2]))
    if a.tcp_send:
        h, port, size, secs = a.tcp_send
        return tcp_send(h, int(port), int(size), float(secs))

    Hosts, can_make_hosts = _load_hosts_class()
    why = can_make_hosts()
    if why is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    a.bytes = int(a.size_mib * (1 << 20)) // 4 * 4
    procs_list = [int(x) for x in a.procs.split(",") if x]
    algos = [x for x in a.algorithms.split(",") if x]
    bufsize = a.tcp_buffer_mib << 20
    started = time.time()
    load0 = _loadavg()
    print(f"# {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average {load0}", flush=True)
    code = _code_state()
    print(f"# minidist at {code}", flush=True)

    hosts = Hosts(2)
    ps = Procs(hosts)
    rows = []
    tcp1: list[float] = []
    tcp2: list[float] = []
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

    def stop(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")

    for s in old:
        signal.signal(s, stop)
    try:
        print(f"# hosts {hosts.names} at {hosts.addrs}", flush=True)
        for i in range(a.repeats):
            wait_quiet(a.wait_quiet)
            tcp1 += measure_tcp(ps, hosts, a.tcp_seconds, bufsize, both=False)
            wait_quiet(a.wait_quiet)
            tcp2 += measure_tcp(ps, hosts, a.tcp_seconds, bufsize, both=True)
            print(f"# TCP run {i + 1}: one stream {tcp1[-1]:.3f} GB/s; two opposite "
                  f"streams {tcp2[-2]:.3f} + {tcp2[-1]:.3f} GB/s", flush=True)
        port = MINIDIST_PORT
        for nproc in procs_list:
            for algo in algos:
                name, cross = schedule_cross_bytes(nproc, algo, a.bytes // 4)
                blocks = []
                for i in range(a.repeats):
                    port += 1  # a fresh port per job: no wait on the previous one's
                    wait_quiet(a.wait_quiet)
                    r = measure_minidist(ps, hosts, nproc, algo, a, port)
                    blocks += r["blocks"]
                    ts = [b["seconds"] / a.iters for b in r["blocks"]]
                    print(f"# {nproc}/host {name} job {i + 1}: "
                          + ", ".join(f"{a.bytes / t / 1e9:.3f}" for t in ts)
                          + " GB/s algbw per block", flush=True)
                n = 2 * nproc
                t = statistics.median(b["seconds"] / a.iters for b in blocks)
                link = statistics.median((b["rx"] + b["tx"]) / 2 / b["seconds"]
                                         for b in blocks)
                algbw = a.bytes / t / 1e9
                rows.append({
                    "procs_per_host": nproc, "ranks": n, "algorithm": name,
                    "requested": algo, "seconds": t, "algbw": algbw,
                    "busbw": algbw * 2 * (n - 1) / n, "link": link / 1e9,
                    "sched_cross_bytes": cross,
                    "algbw_all": [a.bytes / (b["seconds"] / a.iters) / 1e9 for b in blocks],
                })
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        ps.kill_all()
        hosts.close()

    tcp = statistics.median(tcp1)
    tcp_bi = statistics.median(tcp2)
    load1 = _loadavg()
    size = f"{a.size_mib:g} MiB"
    print()
    print(f"one TCP stream host0 -> host1: median {tcp:.3f} GB/s "
          f"(runs: {', '.join(f'{x:.3f}' for x in tcp1)})")
    print(f"two TCP streams, opposite directions at once: median {tcp_bi:.3f} GB/s per "
          f"direction (runs: {', '.join(f'{x:.3f}' for x in tcp2)})")
    print()
    print(f"all_reduce float32 SUM, {size}, 2 hosts; medians of "
          f"{a.repeats} jobs x {a.blocks} blocks x {a.iters} iterations")
    hdr = (f"{'procs/host':>10} {'ranks':>5} {'algorithm':>13} {'time ms':>8} "
           f"{'algbw GB/s':>10} {'busbw GB/s':>10} {'link GB/s':>9} {'sched MiB':>9} "
           f"{'busbw/TCP':>9} {'link/TCP':>8}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['procs_per_host']:>10} {r['ranks']:>5} {r['algorithm']:>13} "
              f"{r['seconds'] * 1e3:>8.2f} {r['algbw']:>10.3f} {r['busbw']:>10.3f} "
              f"{r['link']:>9.3f} {r['sched_cross_bytes'] / 2**20:>9.1f} "
              f"{r['busbw'] / tcp:>9.2f} {r['link'] / tcp:>8.2f}")
    print()
    print("busbw = algbw * 2(n-1)/n, n = ranks; link = bytes per second per direction on "
          "host 0's veth (headers included); sched = payload MiB host 0 sends across per "
          "call")
    print(f"minidist at {code}; load average before {load0}, after {load1}; "
          f"{time.time() - started:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": platform.node(), "minidist": code, "cpus": os.cpu_count(),
                       "python": platform.python_version(), "size_bytes": a.bytes,
                       "iters": a.iters, "blocks": a.blocks, "repeats": a.repeats,
                       "tcp_one_stream": tcp1, "tcp_two_streams": tcp2,
                       "tcp_median": tcp, "tcp_bidir_median": tcp_bi, "rows": rows,
                       "load_before": load0, "load_after": load1}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
