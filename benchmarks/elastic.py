"""What a worker's death costs a job that goes on: detection, shrink, rejoin.

    python benchmarks/elastic.py --workers 8,32,128 --trials 5
    python benchmarks/elastic.py --workers 8 --hosts 2      # two emulated hosts
    python benchmarks/elastic.py --agreement 32,1024        # shrink alone, N ranks

For each W, a job of a learner and W workers runs under ``minidist run
--restart-failed``. Each trial, every rank but one worker waits in a barrier on the
group of everyone; the learner kills that worker with SIGKILL and measures (all on the
node's monotonic clock):

* ``error``: from the kill until the last survivor's barrier raised PeerLostError;
* ``shrink``: how long each survivor's ``shrink_group`` took (p50 and max over ranks;
  the first callers wait for the last survivor to learn of the death), and ``after the
  last error``: from the last survivor's error until every survivor had its answer;
* ``cpu``: what each survivor's process spent of CPU (``time.process_time``: both its
  threads, user and system) from entering the barrier to its error, and in
  ``shrink_group`` (p50 over ranks);
* ``back``: from the kill until the learner's first collective on a new group with the
  restarted worker (``wait_ranks``, ``new_group``, a barrier) returned.

Side by side in the same invocation, the peer is what a job without shrink and rejoin
does instead (torchrun's and Horovod's way): start the whole job of W + 1 ranks again
(``minidist run``, ``init``, a barrier); ``back / full restart`` is the ratio.

With ``--hosts 2`` the ranks are split over two emulated hosts (network namespaces on a
bridge, as ``tests/multinode`` makes them; needs root), a launcher on each, and a whole
host is killed: the first host's ranks shrink and go on (``host_error``, ``host_shrink``).

``--agreement N,...`` measures the rendezvous' shrink alone: N ranks' control connections
in one process (one event loop, so this is an upper bound of the rendezvous' own share),
one of them declared dead, the others ask to shrink at once; the time until every
caller has its answer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = "ELASTIC_BENCH "


# ----------------------------------------------------------------------------- ranks


def rank_main(trials: int) -> None:
    """One rank of the measured job (rank 0: the learner)."""
    import minidist

    minidist.init(timeout=120)
    rank, n = minidist.get_rank(), minidist.get_world_size()
    everyone = list(range(n))
    g = minidist.new_group(everyone)
    if os.environ.get("MINIDIST_RESTART_COUNT"):  # back: join the learner's next barrier
        minidist.barrier(group=g)
        minidist.gather_object(None, dst=0, group=g)
    rows = []
    while True:
        msg = minidist.broadcast_object({"t": len(rows), "victim": 1 + len(rows) % (n - 1)}
                                        if rank == 0 else None, src=0, group=g)
        if msg["t"] >= trials:
            break
        victim = msg["victim"]
        pids = minidist.gather_object(os.getpid(), dst=0, group=g)
        if rank == victim:
            time.sleep(60)  # the learner kills this process
        t_kill = 0.0
        c0 = time.process_time()  # this process's CPU, both threads, user and system
        if rank == 0:
            time.sleep(0.05)  # every other rank is in the barrier by now
            t_kill = time.monotonic()
            os.kill(pids[g.rank_of(victim)], signal.SIGKILL)
        try:
            minidist.barrier(group=g)
            raise SystemExit("the barrier did not fail")
        except minidist.PeerLostError:
            t_err = time.monotonic()
        s0, c1 = time.monotonic(), time.process_time()
        minidist.shrink_group(group=g)
        t_done = time.monotonic()
        shrink, cpu = t_done - s0, (c1 - c0, time.process_time() - c1)
        if minidist.wait_ranks([victim], timeout=60) != [victim]:
            raise SystemExit(f"rank {victim} did not come back")
        g = minidist.new_group(everyone)
        minidist.barrier(group=g)
        t_in = time.monotonic()
        got = minidist.gather_object((t_err, shrink, t_done, cpu), dst=0, group=g)
        if rank == 0:
            survivors = [x for x in got if x is not None]  # (the restarted rank: None)
            errs = [x[0] for x in survivors]
            shrinks = sorted(1000 * x[1] for x in survivors)
            rows.append({"agreement_ms": 1000 * (max(x[2] for x in survivors) - max(errs)),
                         "error_ms": 1000 * (max(errs) - t_kill),
                         "first_error_ms": 1000 * (min(errs) - t_kill),
                         "shrink_ms_p50": statistics.median(shrinks),
                         "shrink_ms_max": shrinks[-1],
                         "back_ms": 1000 * (t_in - t_kill),
                         "cpu_error_ms_p50": 1000 * statistics.median(x[3][0] for x in survivors),
                         "cpu_shrink_ms_p50": 1000 * statistics.median(
                             x[3][1] for x in survivors)})
    if rank == 0:
        print(RESULT + json.dumps(rows), flush=True)
    minidist.destroy()


def fresh_main() -> None:
    """The peer: a whole job started again (init and a barrier)."""
    import minidist

    minidist.init(timeout=120)
    minidist.barrier()
    minidist.destroy()


def host_main() -> None:
    """Two emulated hosts: the second host's ranks are killed together; the first
    host's ranks (rank 0 among them) shrink and go on."""
    import minidist

    minidist.init(timeout=120)
    rank, n = minidist.get_rank(), minidist.get_world_size()
    first = n // 2
    minidist.barrier()
    if rank >= first:
        time.sleep(120)  # the driver kills this host's launcher and ranks
    print(f"READY_TO_DIE {time.monotonic()}", flush=True)
    try:
        minidist.barrier()
        raise SystemExit("the barrier did not fail")
    except minidist.PeerLostError:
        t_err = time.monotonic()
    s0 = time.monotonic()
    g = minidist.shrink_group()
    shrink = time.monotonic() - s0
    x = minidist.all_gather_object((t_err, shrink), group=g)
    if rank == 0:
        print(RESULT + json.dumps({"members": list(g.ranks), "t_err": max(e for e, _ in x),
                                   "shrinks": sorted(1000 * s for _, s in x)}), flush=True)
    minidist.barrier(group=g)
    os._exit(0)  # the dead host's ranks cannot say goodbye: do not wait for them


# ----------------------------------------------------------------------------- driver


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def measure_job(w: int, trials: int) -> list[dict]:
    cmd = [sys.executable, "-m", "minidist", "run", "-n", str(w + 1), "--restart-failed",
           str(trials + 5), __file__, "--rank-mode", "job", "--trials", str(trials)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(),
                       timeout=300 + 3 * w)
    for line in p.stdout.splitlines():
        if RESULT in line:
            return json.loads(line.split(RESULT, 1)[1])
    raise RuntimeError(f"W={w}: no result (exit {p.returncode}):\n{p.stderr[-3000:]}")


def measure_fresh(w: int) -> float:
    cmd = [sys.executable, "-m", "minidist", "run", "-n", str(w + 1), __file__,
           "--rank-mode", "fresh"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300 + 3 * w)
    if p.returncode != 0:
        raise RuntimeError(f"fresh W={w}: exit {p.returncode}:\n{p.stderr[-2000:]}")
    return 1000 * (time.monotonic() - t0)


def measure_hosts(w: int) -> dict:
    """Two emulated hosts (network namespaces joined by a bridge, as tests/multinode
    makes them; root only), a launcher on each; host 1's launcher and ranks are killed
    at once."""
    sys.path.insert(0, str(ROOT))
    from tests.multinode.netns import Hosts, can_make_hosts

    why = can_make_hosts()
    if why is not None:
        return {"skipped": why}
    per = (w + 2) // 2
    hosts = Hosts(2)
    env = {**_env(), "MINIDIST_SECRET": f"elastic-hosts-{os.getpid()}"}
    procs = []
    try:
        for k in (0, 1):
            cmd = [*hosts.prefix(k), sys.executable, "-m", "minidist", "run", "-n", str(per),
                   "--nnodes", "2", "--node-rank", str(k), "--master-addr", hosts.addrs[0],
                   "--master-port", "29651", "--grace", "60", __file__, "--rank-mode", "host"]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, env=env,
                                          start_new_session=True))
        line = ""
        end = time.monotonic() + 120
        while "READY_TO_DIE" not in line and time.monotonic() < end:
            line = procs[0].stdout.readline()
        time.sleep(0.1)  # node 0's ranks wait in the barrier: host 1 dies as a whole
        t_kill = time.monotonic()
        os.killpg(procs[1].pid, signal.SIGKILL)
        out, err = procs[0].communicate(timeout=120)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        hosts.close()
    for ln in out.splitlines():
        if RESULT in ln:
            r = json.loads(ln.split(RESULT, 1)[1])
            return {"ranks": 2 * per, "survivors": r["members"],
                    "host_error_ms": round(1000 * (r["t_err"] - t_kill), 1),
                    "host_shrink_ms_p50": round(statistics.median(r["shrinks"]), 1),
                    "host_shrink_ms_max": round(max(r["shrinks"]), 1)}
    raise RuntimeError(f"hosts: no result:\n{err[-3000:]}")


def measure_agreement(n: int, rounds: int) -> dict:
    """The rendezvous' shrink alone with N control connections in this process."""
    import asyncio

    from minidist.rendezvous.agreement import runs
    from minidist.rendezvous.client import RendezvousClient
    from minidist.rendezvous.server import RendezvousServer

    async def one() -> list[float]:
        secret = os.urandom(16)
        server = RendezvousServer(secret, n, host="127.0.0.1")
        await server.start()
        clients = [RendezvousClient(secret, lambda r, why: None, lambda b: None,
                                    lambda g: 0) for _ in range(n)]
        try:
            for c in clients:
                await c.connect("127.0.0.1", server.port, 30)
            await asyncio.gather(*(c.register(r, n, r, 60) for r, c in enumerate(clients)))
            times = []
            for k in range(rounds):
                dead = n - 1 - k
                server.declare_lost(dead, "benchmark")
                ranks = list(range(n - k))
                body = {"t": "agree", "kind": "shrink", "group": 7, "seq": k,
                        "runs": runs(ranks), "exclude": [], "flag": True}

                async def ask(c: RendezvousClient, body: dict) -> float:
                    await c.request(body, timeout=60)
                    return time.monotonic()

                t0 = time.monotonic()
                done = await asyncio.gather(*(ask(c, body) for c in clients[:dead]))
                times.append(1000 * (max(done) - t0))
            return times
        finally:
            for c in clients:
                await c.close(graceful=False)
            await server.close()

    times = asyncio.run(one())
    return {"ranks": n, "shrink_ms_p50": round(statistics.median(times), 2),
            "shrink_ms_max": round(max(times), 2), "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="8,32,128")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=0, help="2: the two-host measurement")
    ap.add_argument("--agreement", default="", help="N,... : the rendezvous' shrink alone")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--rank-mode", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_mode == "job":
        return rank_main(a.trials)
    if a.rank_mode == "fresh":
        return fresh_main()
    if a.rank_mode == "host":
        return host_main()
    out: dict = {"jobs": [], "hosts": None, "agreement": []}
    for n in [int(x) for x in a.agreement.split(",") if x]:
        r = measure_agreement(n, rounds=5)
        out["agreement"].append(r)
        print(f"agreement N={n:5d}: shrink p50 {r['shrink_ms_p50']:.2f} ms, "
              f"max {r['shrink_ms_max']:.2f} ms", flush=True)
    for w in [int(x) for x in a.workers.split(",") if x] if not a.hosts else []:
        rows = measure_job(w, a.trials)
        fresh = measure_fresh(w)

        def med(k: str, rows: list[dict] = rows) -> float:
            return round(statistics.median(r[k] for r in rows), 1)

        def top(k: str, rows: list[dict] = rows) -> float:
            return round(max(r[k] for r in rows), 1)

        r = {"workers": w, "trials": len(rows), "error_ms_p50": med("error_ms"),
             "first_error_ms_p50": med("first_error_ms"),
             "error_ms_max": top("error_ms"), "shrink_ms_p50": med("shrink_ms_p50"),
             "shrink_ms_max": top("shrink_ms_max"), "agreement_ms_p50": med("agreement_ms"),
             "agreement_ms_max": top("agreement_ms"), "back_ms_p50": med("back_ms"),
             "back_ms_max": top("back_ms"), "cpu_error_ms_p50": med("cpu_error_ms_p50"),
             "cpu_shrink_ms_p50": med("cpu_shrink_ms_p50"), "full_restart_ms": round(fresh, 1),
             "back_over_full_restart": round(med("back_ms") / fresh, 3),
             "per_trial": [{k: round(v, 1) for k, v in row.items()} for row in rows]}
        out["jobs"].append(r)
        print(f"W={w:4d}: error p50 {r['error_ms_p50']} max {r['error_ms_max']} ms (first "
              f"survivor p50 {r['first_error_ms_p50']}) | "
              f"shrink p50 {r['shrink_ms_p50']} max {r['shrink_ms_max']} ms (after the last "
              f"error: p50 {r['agreement_ms_p50']} max {r['agreement_ms_max']}) | back p50 "
              f"{r['back_ms_p50']} max {r['back_ms_max']} ms | a survivor's CPU p50: to "
              f"its error {r['cpu_error_ms_p50']} ms, in shrink {r['cpu_shrink_ms_p50']} ms | "
              f"full restart "
              f"{r['full_restart_ms']} ms (back/full {r['back_over_full_restart']})",
              flush=True)
    if a.hosts == 2:
        w = max(int(x) for x in a.workers.split(","))
        out["hosts"] = measure_hosts(w)
        print(f"two hosts, {out['hosts']['ranks']} ranks, one host killed: "
              f"{out['hosts']}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
