"""The RL stepping loop, side by side: a learner (rank 0) sends one action (an int64) to
each of W env workers and collects one observation from each, every step.

    python benchmarks/rl_step.py --workers 8,32 --obs 256 --rounds 3
    python benchmarks/rl_step.py --workers 32 --obs 256 --vary --mode lockstep,firstk -k 8
    python benchmarks/rl_step.py --systems pipe,md,md-p2p --workers 128 --obs 16
    python benchmarks/rl_step.py --systems pipe,md,md-p2p --core compiled,pure --workers 8

Modes: ``lockstep`` (every step waits for all W observations) and ``firstk`` (the
learner takes the first k observations that are ready and gives those k workers their
next action; the others keep stepping). Systems:

* lockstep: ``pipe`` (multiprocessing.Pipe, send_bytes / recv_bytes_into), ``queue``
  (multiprocessing.Queue: one per worker for actions, one shared for observations),
  ``gloo`` (torch.distributed scatter + gather), ``md`` (minidist scatter + gather,
  numpy), ``md-torch`` (the same loop through ``import minidist.torch as dist``),
  ``md-p2p`` (minidist send / recv), ``bare`` (no library: one shared segment, a futex
  word that wakes every worker and a count whose last increment wakes the learner,
  nothing checked; the ceiling of that design in Python);
* firstk: ``pipe`` (multiprocessing.connection.wait), ``queue``, ``md-any`` (k times
  minidist recv(src=None)), ``md-many`` (minidist.recv_many), ``md-many-torch``.

A worker's env step is a few numpy operations, plus ``--work`` microseconds of CPU
(busy) work, plus with ``--vary`` a sleep of uniform 0 - 1 ms (an env waiting on its
simulator). Every system runs once per round, in turn, on the same machine; a figure is
the median over rounds of env steps per second (observations the learner took per
second), a ratio the median of the ratios within a round (the slow spells of a shared
machine weigh on both sides alike). Ratios are to ``pipe`` in the same mode; firstk
systems are also compared with minidist's own lockstep (``md``) when it ran, and a
``-torch`` system with its numpy twin (``md-torch`` with ``md``).

Every process of every system has torch imported (when it is installed), as an RL job's
processes do: this script imports it at its top, so ``minidist run`` imports it once
before it forks the ranks, as it does for any script that imports torch at its top.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:  # every process of every system has torch imported, as an RL job's processes do
    import torch  # noqa: F401  (minidist run then imports it once, before it forks)
except ImportError:
    pass
LOCKSTEP = ("pipe", "queue", "gloo", "md", "md-torch", "md-p2p", "bare")
FIRSTK = ("pipe", "queue", "md-any", "md-many", "md-many-torch")
MARK = "RL_STEP_RESULT "
STOP = -1


# ----------------------------------------------------------------------------- the env


class Env:
    """One worker's environment: writes the action into the observation (the learner
    checks it), then works and sleeps as asked."""

    def __init__(self, obs_bytes: int, work_us: float, vary: bool, seed: int) -> None:
        import numpy as np

        self.obs = np.zeros(max(obs_bytes, 16), np.uint8)[:obs_bytes]
        self.words = self.obs[:16].view(np.int64) if obs_bytes >= 16 else None
        self.work = work_us * 1e-6
        self.vary = vary
        self.rng = np.random.default_rng(seed)
        self.steps = 0

    def step(self, action: int):
        self.steps += 1
        if self.words is not None:
            self.words[0] = action
            self.words[1] = self.steps
        if self.work:
            end = time.perf_counter() + self.work
            while time.perf_counter() < end:
                pass
        if self.vary:
            time.sleep(self.rng.uniform(0.0, 1e-3))
        return self.obs


class Clock:
    """Warm-up, then the timed part: ``tick(n)`` counts n observations."""

    def __init__(self, seconds: float, warmup: float) -> None:
        self.seconds, self.warmup = seconds, warmup
        self.start = time.perf_counter()
        self.timed_from: float | None = None
        self.taken = 0

    def tick(self, n: int) -> bool:
        """Count ``n`` observations; False once the time is up."""
        now = time.perf_counter()
        if self.timed_from is None:
            if now - self.start >= self.warmup:
                self.timed_from = now
            return True
        self.taken += n
        return now - self.timed_from < self.seconds

    def result(self, **extra) -> None:
        elapsed = time.perf_counter() - self.timed_from
        print(MARK + json.dumps({"steps_per_s": self.taken / elapsed, **extra}), flush=True)


def _check(obs_row, action: int, obs_bytes: int) -> None:
    if obs_bytes >= 16 and int(obs_row[:8].view("int64")[0]) != action:
        raise SystemExit(f"wrong observation: action {action}, got "
                         f"{int(obs_row[:8].view('int64')[0])}")


# ----------------------------------------------------------------------------- multiprocessing


def _pipe_worker(conn, wid: int, a) -> None:
    import numpy as np

    env = Env(a.obs, a.work, a.vary, wid)
    act = np.zeros(1, np.int64)
    while True:
        conn.recv_bytes_into(act)
        if act[0] == STOP:
            return
        conn.send_bytes(env.step(int(act[0])))


def _queue_worker(actions, observations, wid: int, a) -> None:
    env = Env(a.obs, a.work, a.vary, wid)
    while True:
        action = actions.get()
        if action == STOP:
            return
        observations.put((wid, env.step(action).tobytes()))


BARE_SPIN = 20  # looks at the step word before a bare worker sleeps on it


def _bare_worker(name: str, wid: int, a) -> None:
    from multiprocessing import shared_memory

    from minidist.shm.fast_slots import futex_add, futex_wait

    shm = shared_memory.SharedMemory(name)
    words, acts, obs, base = _bare_views(shm, a.workers, a.obs)
    env = Env(a.obs, a.work, a.vary, wid)
    seen = 0
    while True:
        looks = 0
        while words[0] == seen:
            looks += 1
            if looks > BARE_SPIN:
                futex_wait(base, seen, 1.0)
        seen = int(words[0])
        action = int(acts[wid])
        if action == STOP:
            break
        obs[wid] = env.step(action)
        futex_add(base + 64, a.workers - 1)  # the last one wakes the learner
    del words, acts, obs
    shm.close()


def _bare_views(shm, W: int, B: int) -> tuple:
    """(step and count words, actions, observations, the step word's address)."""
    import ctypes

    import numpy as np

    buf = np.ndarray(shm.size, np.uint8, shm.buf)
    acts = buf[4096:4096 + 8 * W].view(np.int64)
    obs = buf[4096 + 8 * W:4096 + 8 * W + W * B].reshape(W, B)
    base = ctypes.addressof(ctypes.c_char.from_buffer(shm.buf))
    return buf[:128].view(np.int32), acts, obs, base


def run_bare(a) -> None:
    """The lockstep loop over one shared segment with no library and no checks: the
    ceiling of the design in Python (one futex word wakes every worker, a count whose
    last increment wakes the learner, actions and observations in arrays)."""
    import multiprocessing as mp
    from multiprocessing import shared_memory

    from minidist.shm.fast_slots import futex_wait, futex_wake

    W, B = a.workers, a.obs
    shm = shared_memory.SharedMemory(create=True, size=4096 + W * (8 + B))
    words, acts, obs, base = _bare_views(shm, W, B)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_bare_worker, args=(shm.name, w, a), daemon=True)
             for w in range(W)]
    try:
        for p in procs:
            p.start()
        clock = Clock(a.seconds, a.warmup)
        step = 0
        while clock.tick(W):
            step += 1
            acts[:] = step
            words[16] = 0
            words[0] = step
            futex_wake(base)
            while True:
                count = int(words[16])
                if count >= W:
                    break
                futex_wait(base + 64, count, 1.0)
        _check(obs[W - 1], step, B)
        acts[:] = STOP
        words[0] = step + 1
        futex_wake(base)
        clock.result()
        for p in procs:
            p.join(10)
    finally:
        del words, acts, obs
        shm.close()
        shm.unlink()


def run_multiprocessing(a) -> None:
    import multiprocessing as mp
    from multiprocessing.connection import wait

    import numpy as np

    ctx = mp.get_context("fork")
    W, B = a.workers, a.obs
    clock = None
    procs = []
    if a.system == "pipe":
        conns = []
        for w in range(W):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_pipe_worker, args=(theirs, w, a), daemon=True)
            p.start()
            procs.append(p)
            conns.append(mine)
        obs = np.zeros((W, B), np.uint8)
        act = np.zeros(1, np.int64)
        index = {c: i for i, c in enumerate(conns)}
        clock = Clock(a.seconds, a.warmup)
        step = 0
        if a.mode == "lockstep":
            while clock.tick(W):
                step += 1
                act[0] = step
                for c in conns:
                    c.send_bytes(act)
                for w, c in enumerate(conns):
                    c.recv_bytes_into(obs[w])
            _check(obs[W - 1], step, B)
        else:
            act[0] = 1
            for c in conns:
                c.send_bytes(act)
            pending = set(conns)
            while True:
                ready = wait(list(pending))[:a.k]
                for c in ready:
                    c.recv_bytes_into(obs[index[c]])
                step += 1
                act[0] = step
                for c in ready:
                    c.send_bytes(act)
                if not clock.tick(len(ready)):
                    break
            for c in conns:
                c.recv_bytes_into(obs[index[c]])
        act[0] = STOP
        for c in conns:
            c.send_bytes(act)
    else:  # queue
        actions = [ctx.Queue() for _ in range(W)]
        observations = ctx.Queue()
        for w in range(W):
            p = ctx.Process(target=_queue_worker, args=(actions[w], observations, w, a),
                            daemon=True)
            p.start()
            procs.append(p)
        obs = np.zeros((W, B), np.uint8)
        clock = Clock(a.seconds, a.warmup)
        step = 0
        if a.mode == "lockstep":
            while clock.tick(W):
                step += 1
                for q in actions:
                    q.put(step)
                for _ in range(W):
                    w, data = observations.get()
                    obs[w] = np.frombuffer(data, np.uint8)
            _check(obs[W - 1], step, B)
        else:
            for q in actions:
                q.put(1)
            while True:
                step += 1
                for _ in range(a.k):
                    w, data = observations.get()
                    obs[w] = np.frombuffer(data, np.uint8)
                    actions[w].put(step)
                if not clock.tick(a.k):
                    break
            for _ in range(W):
                observations.get()
        for q in actions:
            q.put(STOP)
    clock.result()
    for p in procs:
        p.join(10)


# ----------------------------------------------------------------------------- minidist / gloo


def _torch_loop(dist, a, rank: int) -> None:
    """scatter + gather with torch tensors (gloo or minidist.torch), as the numpy loop:
    the learner's actions and observations are batches (one tensor each, as a policy
    takes and gives them), scattered from and gathered into as lists of their rows."""
    import torch

    W, B = a.workers, a.obs
    act = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        actions = torch.zeros(W + 1, 1, dtype=torch.int64)
        batch = torch.zeros(W + 1, B, dtype=torch.uint8)
        acts, obs = list(actions.unbind()), list(batch.unbind())
        mine = torch.zeros(B, dtype=torch.uint8)
        clock = Clock(a.seconds, a.warmup)
        step = 0
        while clock.tick(W):
            step += 1
            actions.fill_(step)
            dist.scatter(act, acts, src=0)
            dist.gather(mine, obs, dst=0)
        _check(batch[W].numpy(), step, B)
        actions.fill_(STOP)
        dist.scatter(act, acts, src=0)
        clock.result()
    else:
        env = Env(B, a.work, a.vary, rank)
        obs_t = torch.from_numpy(env.obs)
        while True:
            dist.scatter(act, None, src=0)
            action = int(act)  # a one-element tensor's value, read once
            if action == STOP:
                break
            env.step(action)
            dist.gather(obs_t, None, dst=0)


def _torch_many(dist, a, rank: int) -> None:
    """firstk with minidist.torch.recv_many and send."""
    import torch

    W, B, k = a.workers, a.obs, a.k
    if rank == 0:
        act = torch.zeros(1, dtype=torch.int64)
        got = torch.zeros((k, B), dtype=torch.uint8)
        act.fill_(1)
        for w in range(1, W + 1):
            dist.send(act, w)
        clock = Clock(a.seconds, a.warmup)
        step = 0
        while True:
            senders = dist.recv_many(got)
            step += 1
            act.fill_(step)
            for s in senders.tolist():
                dist.send(act, s)
            if not clock.tick(k):
                break
        rest = torch.zeros((W, B), dtype=torch.uint8)
        dist.recv_many(rest)
        act.fill_(STOP)
        for w in range(1, W + 1):
            dist.send(act, w)
        clock.result()
    else:
        env = Env(B, a.work, a.vary, rank)
        act = torch.zeros(1, dtype=torch.int64)
        obs_t = torch.from_numpy(env.obs)
        while True:
            dist.recv(act, 0)
            action = int(act)  # a one-element tensor's value, read once
            if action == STOP:
                break
            env.step(action)
            dist.send(obs_t, 0)


def run_gloo_rank(a) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    _torch_loop(dist, a, dist.get_rank())
    dist.destroy_process_group()


def run_minidist_rank(a) -> None:
    import numpy as np

    if a.system in ("md-torch", "md-many-torch"):
        import minidist.torch as dist

        dist.init_process_group()
        if a.system == "md-torch":
            _torch_loop(dist, a, dist.get_rank())
        else:
            _torch_many(dist, a, dist.get_rank())
        dist.destroy_process_group()
        return
    import minidist as md

    md.init()
    rank = md.get_rank()
    W, B, k = a.workers, a.obs, a.k
    act = np.zeros(1, np.int64)
    if rank != 0:
        env = Env(B, a.work, a.vary, rank)
        if a.system == "md":
            while True:
                md.scatter(act, None, src=0)
                if act[0] == STOP:
                    break
                md.gather(env.step(int(act[0])), None, dst=0)
        else:
            while True:
                md.recv(act, 0)
                if act[0] == STOP:
                    break
                md.send(env.step(int(act[0])), 0)
        md.destroy()
        return
    clock = Clock(a.seconds, a.warmup)
    step = 0
    if a.system == "md":
        acts = np.zeros(W + 1, np.int64)
        obs = np.zeros((W + 1, B), np.uint8)
        mine = np.zeros(B, np.uint8)
        while clock.tick(W):
            step += 1
            acts[:] = step
            md.scatter(act, acts, src=0)
            md.gather(mine, obs, dst=0)
        _check(obs[W], step, B)
        acts[:] = STOP
        md.scatter(act, acts, src=0)
    elif a.system == "md-p2p":
        obs = np.zeros((W + 1, B), np.uint8)
        while clock.tick(W):
            step += 1
            act[0] = step
            for w in range(1, W + 1):
                md.send(act, w)
            for w in range(1, W + 1):
                md.recv(obs[w], w)
        _check(obs[W], step, B)
        act[0] = STOP
        for w in range(1, W + 1):
            md.send(act, w)
    else:  # md-any, md-many: first k
        got = np.zeros((k, B), np.uint8)
        act[0] = 1
        for w in range(1, W + 1):
            md.send(act, w)
        while True:
            if a.system == "md-many":
                senders = md.recv_many(got).tolist()
            else:
                senders = [md.recv(got[i]) for i in range(k)]
            step += 1
            act[0] = step
            for s in senders:
                md.send(act, s)
            if not clock.tick(k):
                break
        for _ in range(W):  # every worker has one observation outstanding
            md.recv(got[0])
        act[0] = STOP
        for w in range(1, W + 1):
            md.send(act, w)
    clock.result()
    md.destroy()


# ----------------------------------------------------------------------------- the parent


def _child_args(a, system: str, mode: str, W: int, B: int, work: float) -> list[str]:
    return ["--child", system, "--mode", mode, "--workers", str(W), "--obs", str(B),
            "--work", str(work), "-k", str(a.k), "--seconds", str(a.seconds),
            "--warmup", str(a.warmup)] + (["--vary"] if a.vary else [])


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                        "MASTER_ADDR", "MASTER_PORT", "MINIDIST_PORT", "MINIDIST_SECRET")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(a, system: str, mode: str, W: int, B: int, work: float,
            core: str | None = None) -> float | None:
    """One run of one system (a minidist one on ``core``, "compiled" or "pure"): env steps
    per second (None if it failed)."""
    me = [sys.executable, str(Path(__file__).resolve())]
    args = _child_args(a, system, mode, W, B, work)
    limit = a.seconds + a.warmup + 60 + W
    env = _env()
    if core == "pure":
        env["MINIDIST_CORE"] = "0"
    elif core == "compiled":  # fail, rather than measure the pure core under its name
        env.update(MINIDIST_CORE="1", MINIDIST_REQUIRE_CORE="1")
    procs: list[subprocess.Popen] = []
    try:
        if system in ("pipe", "queue", "bare"):
            procs = [subprocess.Popen(me + args, env=env, stdout=subprocess.PIPE,
                                      start_new_session=True, text=True)]
        elif system == "gloo":
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                       WORLD_SIZE=str(W + 1))
            for r in range(W + 1):
                procs.append(subprocess.Popen(
                    me + args, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                    stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                    start_new_session=True, text=True))
        else:
            procs = [subprocess.Popen([sys.executable, "-m", "minidist", "run", "-n",
                                       str(W + 1), *me[1:], *args], env=env,
                                      stdout=subprocess.PIPE, start_new_session=True,
                                      text=True)]
        out, _ = procs[0].communicate(timeout=limit)
        for p in procs[1:]:
            p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        out = ""
    finally:
        import signal

        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
    for line in (out or "").splitlines():
        if MARK in line:  # minidist run prefixes "[rank0]: "
            return json.loads(line.split(MARK, 1)[1])["steps_per_s"]
    print(f"  {system} ({mode}) failed (exit {procs[0].returncode})", file=sys.stderr)
    return None


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="8,32,128", help="W values (default 8,32,128)")
    p.add_argument("--obs", default="16,1024,28672",
                   help="observation bytes (default 16,1024,28672)")
    p.add_argument("--work", default="0,50", help="us of CPU work per env step (0,50)")
    p.add_argument("--vary", action="store_true",
                   help="every env step also sleeps uniform 0 - 1 ms")
    p.add_argument("--mode", default="lockstep", help="lockstep,firstk (default lockstep)")
    p.add_argument("-k", type=int, default=8, help="firstk: observations per learner step")
    p.add_argument("--systems", default=None,
                   help=f"comma list; default all of the mode's: lockstep {','.join(LOCKSTEP)}"
                   f"; firstk {','.join(FIRSTK)}")
    p.add_argument("--rounds", type=int, default=3, help="runs of each system, in turn")
    p.add_argument("--seconds", type=float, default=2.0, help="timed seconds per run")
    p.add_argument("--warmup", type=float, default=0.5, help="untimed seconds per run")
    p.add_argument("--core", default="compiled",
                   help="the minidist core(s) to run, comma list of compiled,pure (default "
                   "compiled); with both, minidist systems are named md[compiled], md[pure]")
    p.add_argument("--json", default=None, help="write every run's figure here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        a.system, a.workers, a.obs = a.child, int(a.workers), int(a.obs)
        a.work = float(a.work)
        if a.system in ("pipe", "queue"):
            run_multiprocessing(a)
        elif a.system == "bare":
            run_bare(a)
        elif a.system == "gloo":
            run_gloo_rank(a)
        else:
            run_minidist_rank(a)
        return
    modes = [m for m in a.mode.split(",") if m]
    for m in modes:
        if m not in ("lockstep", "firstk"):
            p.error(f"unknown mode {m!r}")
    wanted = None if a.systems is None else a.systems.split(",")
    cores = [c for c in a.core.split(",") if c]
    for c in cores:
        if c not in ("compiled", "pure"):
            p.error(f"unknown core {c!r} (compiled or pure)")
    results = []
    print(f"# rl_step: {os.cpu_count()} cpus, {a.rounds} rounds of {a.seconds:g} s, "
          f"{'env steps vary 0-1 ms, ' if a.vary else ''}k={a.k}", flush=True)
    for W in _ints(a.workers):
        for B in _ints(a.obs):
            for work in [float(x) for x in a.work.split(",") if x]:
                runs: dict[tuple[str, str], list[float | None]] = {}
                plan = [(m, s, c) for m in modes for s in (LOCKSTEP if m == "lockstep"
                                                           else FIRSTK)
                        if wanted is None or s in wanted or s == "pipe"
                        for c in (cores if s.startswith("md") else [None])]
                for _ in range(a.rounds):
                    for m, s, c in plan:
                        name = s if c is None or len(cores) == 1 else f"{s}[{c}]"
                        runs.setdefault((m, name), []).append(
                            run_one(a, s, m, W, B, work, c))
                results.append(_report(W, B, work, a, runs))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


def _median_ratio(xs: list, ys: list) -> float | None:
    rs = [x / y for x, y in zip(xs, ys, strict=True) if x and y]
    return statistics.median(rs) if rs else None


def _report(W: int, B: int, work: float, a, runs: dict) -> dict:
    head = f"W={W} obs={B} B work={work:g} us{' vary 0-1 ms' if a.vary else ''}"
    print(head, flush=True)
    row = {"workers": W, "obs": B, "work_us": work, "vary": a.vary, "k": a.k,
           "core": a.core, "runs": {}}
    for (m, s), xs in runs.items():
        good = [x for x in xs if x]
        med = statistics.median(good) if good else None
        ref = runs.get((m, "pipe"))
        ratio = _median_ratio(xs, ref) if ref else None
        own = runs.get(("lockstep", "md")) or runs.get(("lockstep", "md[compiled]"))
        extra = ""
        if m == "firstk" and own:
            r2 = _median_ratio(xs, own)
            extra = f"  {r2:.2f}x md lockstep" if r2 else ""
        twin = s.replace("-torch", "")  # a torch system's numpy twin
        if twin != s and runs.get((m, twin)):
            r3 = _median_ratio(xs, runs[(m, twin)])
            extra += f"  {r3:.2f}x {twin}" if r3 else ""
        print(f"  {m:8s} {s:20s} {med / 1e3 if med else float('nan'):8.1f}k steps/s  "
              f"{ratio if ratio else float('nan'):5.2f}x pipe{extra}", flush=True)
        row["runs"][f"{m}/{s}"] = xs
    return row


if __name__ == "__main__":
    main()
