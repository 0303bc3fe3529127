"""Policy weights from one learner to W workers on one node: minidist.SharedArray beside
minidist.broadcast, torch.distributed's gloo broadcast and Ray's ray.put / ray.get.

For each system and W it starts one job of W + 1 processes (rank 0 the learner) and,
for each size, runs ``--rounds`` rounds: every worker waits for the next version, the
learner (after 50 ms, so that the workers are asleep) times one memcpy of the same
size into memory of its own (the reference, side by side) and then the publish; each
worker notes when it holds the new version (CLOCK_MONOTONIC is one clock for the whole
machine). Per round:

* ``publish CPU``: the CPU time of the learner's call (SharedArray.publish, broadcast,
  ray.put; every thread of the learner's process), and ``x memcpy``: that over the
  CPU time of the memcpy just before it (the ratio of the medians). Its wall time is
  shown too: on a machine with fewer cores than workers the woken workers preempt the
  learner, so the wall time holds their work as well;
* ``last worker at``: from the start of the learner's call to the last worker holding
  the version, and ``+``: that beyond the call's CPU time (what the workers add).

``floor`` is the least any publish can cost its readers on this machine, run in the
same invocation: W forked processes asleep on one futex, woken at once, each noting
when it runs (no data, no minidist); on a machine shared with other jobs it says how
much of a time is the machine's.

A time is the median over the rounds. After the rounds each worker reads the whole
version once (an inference step reads every weight) and reports, from
/proc/self/smaps_rollup, how much its PSS and its private memory (USS) grew since
before the array existed (median over the workers).

``--stress S`` instead runs the torn-version stress test for S seconds: the learner
publishes as fast as it can, each worker checks every version it reads (every element
holds the version's number) and holds some views a while.

    python benchmarks/weights.py                               # W = 8, 32, 128
    python benchmarks/weights.py --workers 8 --mib 16 --systems shared,broadcast
    python benchmarks/weights.py --stress 60 --workers 8
    python benchmarks/weights.py --hosts 2 --per-host 16 --mib 16   # as root
    python benchmarks/weights.py --json results.json

gloo and Ray are skipped where torch or Ray is missing, and every system is skipped
where W private copies of the array (broadcast, gloo) would not fit in --mem-gib.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
SETTLE = 0.05  # seconds the learner waits before a publish: the workers are asleep
QUIET = 0.3  # seconds a worker that holds the version sleeps before it reports (so that
# its report does not take the cores from the workers still waking up)
SYSTEMS = ("floor", "shared", "broadcast", "gloo", "ray")


def memory() -> dict[str, float]:
    """This process's PSS and USS in MiB (smaps_rollup)."""
    from minidist import diagnostics

    m = diagnostics.memory_kib(os.getpid())
    return {"pss": m["pss"] / 1024, "uss": m["uss"] / 1024}


def memcpy_time(src: np.ndarray, dst: np.ndarray) -> float:
    """The CPU time of one copy of ``src`` into ``dst``."""
    t = time.process_time()
    np.copyto(dst, src)
    return time.process_time() - t


# ----------------------------------------------------------------------------- jobs


def job_minidist(system: str, sizes: list[float], rounds: int) -> None:
    """One rank of a minidist job (``minidist run``): shared or broadcast."""
    import minidist

    minidist.init(timeout=600)
    rank = minidist.get_rank()
    warm = minidist.SharedArray("warm-up", (1024,), np.float32, src=0)  # one-time costs
    minidist.broadcast(np.zeros(1024, np.float32), src=0)
    minidist.gather_object((0.0, 0.0, True), dst=0)
    warm.close()
    for mib in sizes:
        n = int(mib * MIB) // 4
        before = memory()
        if system == "shared":
            shared = minidist.SharedArray(f"w{mib}", (n,), np.float32, src=0)
        buf = np.zeros(n, np.float32)
        if rank == 0:
            ref = np.empty(n, np.float32)
            ref.fill(0)  # faulted in: the memcpy reference copies into memory in use
        times = []
        for k in range(1, rounds + 1):
            minidist.barrier()
            if rank == 0:
                buf.fill(k)
                time.sleep(SETTLE)
                copy = memcpy_time(buf, ref)
                c0, t0 = time.process_time(), time.monotonic()
                if system == "shared":
                    shared.publish(buf)
                else:
                    minidist.broadcast(buf, src=0)
                t1, cpu = time.monotonic(), time.process_time() - c0
                got = None
            else:
                if system == "shared":
                    shared.wait(k, timeout=600)
                    view, v = shared.read()
                else:
                    minidist.broadcast(buf, src=0)
                got = time.monotonic()
                time.sleep(QUIET)
            stamps = minidist.gather_object(got, dst=0)
            if rank == 0:
                last = max(s for s in stamps if s is not None)
                times.append((t1 - t0, copy, cpu, last - t0))
        # an inference step reads every weight once
        if rank != 0:
            data = shared.read()[0] if system == "shared" else buf
            ok = bool(data[0] == rounds and data[-1] == rounds and float(data.sum()) ==
                      float(rounds) * n)
            grew = memory()
            mem = (grew["pss"] - before["pss"], grew["uss"] - before["uss"], ok)
        else:
            mem = None
        mems = minidist.gather_object(mem, dst=0)
        if rank == 0:
            report(system, minidist.get_world_size() - 1, mib, times, mems[1:])
        if system == "shared":
            shared.close()
        del buf
    minidist.destroy()


def job_gloo(sizes: list[float], rounds: int) -> None:
    """One rank of a torch.distributed gloo job (torchrun)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for mib in sizes:
        n = int(mib * MIB) // 4
        before = memory()
        buf = torch.zeros(n, dtype=torch.float32)
        ref = np.ones(n, np.float32) if rank == 0 else None  # faulted in
        times = []
        for k in range(1, rounds + 1):
            dist.barrier()
            if rank == 0:
                buf.fill_(k)
                time.sleep(SETTLE)
                copy = memcpy_time(buf.numpy(), ref)
                c0, t0 = time.process_time(), time.monotonic()
                dist.broadcast(buf, src=0)
                t1, cpu = time.monotonic(), time.process_time() - c0
                got = None
            else:
                dist.broadcast(buf, src=0)
                got = time.monotonic()
                time.sleep(QUIET)
            stamps = [None] * dist.get_world_size() if rank == 0 else None
            dist.gather_object(got, stamps, dst=0)
            if rank == 0:
                last = max(s for s in stamps if s is not None)
                times.append((t1 - t0, copy, cpu, last - t0))
        mem = None
        if rank != 0:
            ok = bool(float(buf.sum()) == float(rounds) * n)
            grew = memory()
            mem = (grew["pss"] - before["pss"], grew["uss"] - before["uss"], ok)
        mems = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(mem, mems, dst=0)
        if rank == 0:
            report("gloo", dist.get_world_size() - 1, mib, times, mems[1:])
        del buf
    dist.destroy_process_group()
    os._exit(0)  # torch's gloo sometimes aborts in a destructor at exit


def run_ray(workers: int, sizes: list[float], rounds: int) -> None:
    """The learner is this process (Ray's driver); W actors ray.get each version."""
    import ray

    ray.init(num_cpus=workers + 1, include_dashboard=False, log_to_driver=False,
             object_store_memory=int(max(sizes) * MIB * 3 + 256 * MIB))

    @ray.remote(num_cpus=0)
    class Worker:
        def __init__(self) -> None:
            self.base = memory()
            self.weights = None

        def take(self, refs):
            self.weights = ray.get(refs[0])  # zero-copy: a view of the object store
            return time.monotonic()

        def check(self, k: int, n: int):
            w = self.weights
            ok = bool(w[0] == k and float(w.sum()) == float(k) * n)
            grew = memory()
            self.weights = None
            return grew["pss"] - self.base["pss"], grew["uss"] - self.base["uss"], ok

        def rebase(self) -> None:
            self.base = memory()

    actors = [Worker.remote() for _ in range(workers)]
    ray.get([a.rebase.remote() for a in actors])
    try:
        for mib in sizes:
            n = int(mib * MIB) // 4
            ray.get([a.rebase.remote() for a in actors])
            buf = np.zeros(n, np.float32)
            ref = np.ones(n, np.float32)  # faulted in
            times = []
            for k in range(1, rounds + 1):
                buf.fill(k)
                time.sleep(SETTLE)
                copy = memcpy_time(buf, ref)
                c0, t0 = time.process_time(), time.monotonic()
                obj = ray.put(buf)
                t1, cpu = time.monotonic(), time.process_time() - c0
                stamps = ray.get([a.take.remote([obj]) for a in actors])
                last = max(stamps)
                times.append((t1 - t0, copy, cpu, last - t0))
                del obj
            mems = ray.get([a.check.remote(rounds, n) for a in actors])
            report("ray", workers, mib, times, mems)
    finally:
        ray.shutdown()


def run_floor(workers: int, sizes: list[float], rounds: int) -> list[dict]:
    """The least any publish can cost its readers here: W forked processes asleep on one
    futex word, woken at once, each noting when it runs (no data, no minidist)."""
    import mmap

    from minidist.shm import fast_slots

    m = mmap.mmap(-1, 4096 + 8 * workers)
    words = np.frombuffer(m, np.int32, 1024)
    stamps = np.frombuffer(m, np.float64, workers, 4096)
    addr = words.ctypes.data
    pids = []
    total = rounds * len(sizes)
    for i in range(workers):
        pid = os.fork()
        if pid == 0:
            for r in range(1, total + 1):
                while words[0] < r:
                    words[1] = 1
                    fast_slots.futex_wait(addr, int(words[0]), 0.1)
                stamps[i] = time.monotonic()
            os._exit(0)
        pids.append(pid)
    time.sleep(0.5 + workers * 0.005)
    r, rows = 0, []
    for mib in sizes:
        times = []
        for _ in range(rounds):
            r += 1
            time.sleep(SETTLE + QUIET)
            c0, t0 = time.process_time(), time.monotonic()
            words[0] = r
            fast_slots.futex_wake(addr)
            t1, cpu = time.monotonic(), time.process_time() - c0
            time.sleep(QUIET)
            times.append((t1 - t0, 1e-9, cpu, float(stamps.max()) - t0))
        rows.append(report("floor", workers, mib, times, [(0.0, 0.0, True)], echo=False))
    for pid in pids:
        os.waitpid(pid, 0)
    return rows


def report(system: str, workers: int, mib: float, times: list, mems: list,
           echo: bool = True) -> dict:
    """One result line: ``times`` per round (wall time of the learner's call, CPU time of
    the memcpy, CPU time of the call, time from the call's start to the last worker
    holding the version); ``mems`` per worker (PSS growth, USS growth, data correct)."""
    med = [statistics.median(t[i] for t in times) for i in range(4)]
    ratios = med[2] / max(med[1], 1e-9)  # the medians' ratio
    extra = statistics.median(t[3] - t[2] for t in times)
    pss = statistics.median(m[0] for m in mems)
    uss = statistics.median(m[1] for m in mems)
    row = {"system": system, "workers": workers, "mib": mib, "rounds": len(times),
           "publish_ms": med[0] * 1e3, "memcpy_cpu_ms": med[1] * 1e3,
           "publish_cpu_ms": med[2] * 1e3, "x_memcpy": ratios, "extra_ms": extra * 1e3,
           "all_ms": med[3] * 1e3, "pss_mib": pss,
           "uss_mib": uss, "pss_total_mib": sum(m[0] for m in mems),
           "correct": all(m[2] for m in mems), "each_round": times}
    if echo:
        print("RESULT " + json.dumps(row), flush=True)
    return row


# ----------------------------------------------------------------------------- stress


def job_stress(seconds: float, mib: float) -> None:
    import minidist

    minidist.init(timeout=600)
    rank = minidist.get_rank()
    n = int(mib * MIB) // 8
    shared = minidist.SharedArray("stress", (n,), np.int64, src=0)
    minidist.barrier()
    end = time.monotonic() + seconds
    torn = checked = versions = 0
    if rank == 0:
        a = np.empty(n, np.int64)
        while time.monotonic() < end:
            a.fill(versions + 1)
            versions = shared.publish(a)
    else:
        last = 0
        while time.monotonic() < end:
            view, v = shared.read()
            if v == 0:
                continue
            torn += v < last or not (view == v).all()
            versions += v != last
            last = v
            checked += 1
            if checked % 7 == 0:  # hold the view a while: it must not change
                time.sleep(0.0005)
                torn += not (view == v).all()
        shared.release()
    got = minidist.gather_object((versions, checked, torn), dst=0)
    if rank == 0:
        print("STRESS " + json.dumps({"seconds": seconds, "mib": mib,
                                      "workers": len(got) - 1, "published": got[0][0],
                                      "versions_read": [g[0] for g in got[1:]],
                                      "checks": sum(g[1] for g in got[1:]),
                                      "torn": sum(g[2] for g in got[1:])}), flush=True)
    shared.close()
    minidist.destroy()


# ----------------------------------------------------------------------------- driver


def launch(cmd: list[str], env: dict[str, str], timeout: float) -> list[dict]:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True, cwd=ROOT)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", f"timed out after {timeout:g} s"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            p.communicate(timeout=10)
    rows = []
    for line in out.splitlines():
        for tag in ("RESULT ", "STRESS "):
            if tag in line:
                rows.append(json.loads(line.split(tag, 1)[1]))
    if not rows:
        rows.append({"error": (err.strip().splitlines() or ["no output"])[-1][-300:],
                     "cmd": " ".join(cmd)})
    return rows


def run_hosts(o: argparse.Namespace, sizes: list[float], env: dict[str, str],
              me: str) -> list[dict]:
    """The minidist systems over ``--hosts`` emulated hosts (network namespaces joined
    by a bridge; needs root and iproute2) of ``--per-host`` ranks each; with each result
    the bytes that the last host's link received during the job."""
    sys.path.insert(0, str(ROOT))
    from tests.multinode.netns import Hosts, can_make_hosts

    reason = can_make_hosts()
    if reason is not None:
        print(f"# emulated hosts: skipped ({reason})", flush=True)
        return []
    hosts, rows = Hosts(o.hosts), []
    last = o.hosts - 1

    def received() -> int:
        out = subprocess.run([*hosts.prefix(last), "cat", "/proc/net/dev"],
                             capture_output=True, text=True, check=True).stdout
        for text in out.splitlines():
            name, _, rest = text.partition(":")
            if name.strip() == f"mda{hosts.id}{last}":
                return int(rest.split()[0])
        return 0

    try:
        for system in [s for s in o.systems.split(",") if s in ("shared", "broadcast")]:
            before = received()
            procs = []
            for i in range(o.hosts):
                cmd = [*hosts.prefix(i), sys.executable, "-m", "minidist", "run", "--nnodes",
                       str(o.hosts), "--node-rank", str(i), "--master-addr", hosts.addrs[0],
                       "--master-port", "29710", "-n", str(o.per_host), me, "--role", system,
                       "--mib", ",".join(str(x) for x in sizes), "--rounds", str(o.rounds)]
                procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True, env=env,
                                              start_new_session=True, cwd=ROOT))
            outs = []
            for p in procs:
                try:
                    outs.append(p.communicate(timeout=o.timeout)[0])
                except subprocess.TimeoutExpired:
                    outs.append("")
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
            got = [json.loads(t.split("RESULT ", 1)[1]) for t in outs[0].splitlines()
                   if "RESULT " in t] or [{"error": "no result", "cmd": system}]
            crossed = (received() - before) / MIB
            for r in got:
                r.update(hosts=o.hosts, per_host=o.per_host, last_host_received_mib=crossed,
                         versions_mib=sum(sizes) * o.rounds)
                print(line(r) + f"  [{o.hosts} hosts x {o.per_host}: the last host's link "
                      f"received {crossed:.1f} MiB for {sum(sizes) * o.rounds:g} MiB of "
                      "versions]", flush=True)
            rows += got
    finally:
        hosts.close()
    return rows


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MINIDIST_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="8,32,128")
    ap.add_argument("--mib", default="1,16,256")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mem-gib", type=float, default=12.0,
                    help="skip runs whose private copies would exceed this (default 12)")
    ap.add_argument("--ray-max-workers", type=int, default=32,
                    help="Ray and gloo runs above this many workers are skipped (a torch "
                    "or Ray process costs hundreds of MiB)")
    ap.add_argument("--hosts", type=int, default=0,
                    help="run shared and broadcast over this many emulated hosts (root)")
    ap.add_argument("--per-host", type=int, default=16)
    ap.add_argument("--stress", type=float, default=0.0, metavar="SECONDS")
    ap.add_argument("--stress-mib", type=float, default=1.0)
    ap.add_argument("--json")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--role", help=argparse.SUPPRESS)
    o = ap.parse_args()
    sizes = [float(s) for s in o.mib.split(",")]
    if o.role in ("shared", "broadcast"):
        return job_minidist(o.role, sizes, o.rounds)
    if o.role == "gloo":
        return job_gloo(sizes, o.rounds)
    if o.role == "stress":
        return job_stress(o.stress, o.stress_mib)
    env, me = child_env(), str(Path(__file__).resolve())
    rows: list[dict] = []
    if o.hosts:
        rows = run_hosts(o, sizes, env, me)
        if o.json:
            Path(o.json).write_text(json.dumps(rows, indent=1))
        return None
    for w in [int(x) for x in o.workers.split(",")]:
        if o.stress:
            rows += launch([sys.executable, "-m", "minidist", "run", "-n", str(w + 1), me,
                            "--role", "stress", "--stress", str(o.stress), "--stress-mib",
                            str(o.stress_mib)], env, o.timeout)
            print(json.dumps(rows[-1]), flush=True)
            continue
        for system in o.systems.split(","):
            fits = [s for s in sizes if system == "shared" or w * s / 1024 <= o.mem_gib]
            if system in ("gloo", "ray") and w > o.ray_max_workers:
                fits = []
            if system == "gloo" and not _importable("torch"):
                fits = []
            if system == "ray" and not _importable("ray"):
                fits = []
            if not fits:
                print(f"# {system} W={w}: skipped", flush=True)
                continue
            mib = ",".join(str(s) for s in fits)
            if system == "floor":
                got = run_floor(w, fits[:1], o.rounds)
                rows += got
                print(line(got[0]), flush=True)
                continue
            if system == "ray":
                cmd = [sys.executable, me, "--role", "ray-driver", "--mib", mib,
                       "--rounds", str(o.rounds), "--workers", str(w)]
            elif system == "gloo":
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc-per-node", str(w + 1), me, "--role", "gloo", "--mib", mib,
                       "--rounds", str(o.rounds)]
            else:
                cmd = [sys.executable, "-m", "minidist", "run", "-n", str(w + 1), me,
                       "--role", system, "--mib", mib, "--rounds", str(o.rounds)]
            got = launch(cmd, env, o.timeout)
            rows += got
            for r in got:
                print(line(r), flush=True)
    if o.json:
        Path(o.json).write_text(json.dumps(rows, indent=1))


def line(r: dict) -> str:
    if "error" in r:
        return f"# error: {r['error']}  ({r['cmd']})"
    if r["system"] == "floor":
        return (f"{'floor':>9} W={r['workers']:<4d} {'-':>6} MiB  wake CPU "
                f"{r['publish_cpu_ms']:8.2f} ms; last worker at {r['all_ms']:8.2f} ms "
                "(bare processes asleep on one futex, woken at once)")
    return (f"{r['system']:>9} W={r['workers']:<4d} {r['mib']:>6g} MiB  publish CPU "
            f"{r['publish_cpu_ms']:8.2f} ms ({r['x_memcpy']:5.2f}x memcpy "
            f"{r['memcpy_cpu_ms']:.2f} ms), wall {r['publish_ms']:8.2f} ms; last worker at "
            f"{r['all_ms']:8.2f} ms (CPU +{r['extra_ms']:7.2f} ms)  "
            f"PSS +{r['pss_mib']:7.2f} MiB USS +{r['uss_mib']:7.2f} MiB per worker "
            f"(PSS of all workers +{r['pss_total_mib']:.0f} MiB)"
            f"{'' if r['correct'] else '  WRONG DATA'}")


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's minidist, as the jobs it starts use
    if "--role" in sys.argv and sys.argv[sys.argv.index("--role") + 1] == "ray-driver":
        a = sys.argv
        run_ray(int(a[a.index("--workers") + 1]), [float(s) for s in
                a[a.index("--mib") + 1].split(",")], int(a[a.index("--rounds") + 1]))
    else:
        main()
