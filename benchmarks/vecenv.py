"""Stepping Gymnasium environments, side by side: gymnasium's own vector envs and
``minidist.gymnasium.AsyncVectorEnv``, in one invocation.

    python benchmarks/vecenv.py --envs 1,8,32,128 --rounds 3
    python benchmarks/vecenv.py --envs 8 --env work50 --systems gym,md
    python benchmarks/vecenv.py --envs 32 --env vary --systems md,md-k -k 8
    python benchmarks/vecenv.py --envs 1,8,32,128 --plot docs/assets/vecenv.png

The loop is the user's: ``envs.step(actions)`` with a fresh random action per env each
step (``md-k``: ``recv()`` the first ``k`` envs that are ready, then ``send`` those
their next actions). Each run is a fresh interpreter that imports torch first, as a
learner does, builds the vector env, steps it for ``--warmup`` seconds, then counts env
steps for ``--seconds``. Systems:

* ``sync``: ``gymnasium.vector.SyncVectorEnv`` (every env in the caller's process);
* ``gym``: ``gymnasium.vector.AsyncVectorEnv(shared_memory=True)`` (a process and a
  pipe per env);
* ``md``: ``minidist.gymnasium.AsyncVectorEnv`` (a process per env);
* ``md2``: the same with ``num_workers=2`` (two processes, each stepping half the envs);
* ``md-k``: the same with ``batch_size=k`` (first k ready, ``send`` / ``recv``).

Envs (``--env``): ``cartpole`` (CartPole-v1), ``work50`` (CartPole-v1 plus 50 us of
busy CPU work per step), ``vary`` (CartPole-v1 plus a sleep of uniform 0 - 1 ms per
step). Every system runs once per round, in turn; a figure is the median over rounds of
env steps per second, a ratio the median of the ratios within a round (to ``gym``;
``md-k`` also to ``md``), so that a shared machine's slow spells weigh on both sides.
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

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("sync", "gym", "md", "md2", "md-k")
MARK = "VECENV_RESULT "


class Busy(gym.Wrapper):
    """``seconds`` of busy CPU work per step."""

    def __init__(self, env: gym.Env, seconds: float) -> None:
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return self.env.step(action)


class Sleepy(gym.Wrapper):
    """A sleep of uniform 0 - 1 ms per step (a simulator the env waits on)."""

    def __init__(self, env: gym.Env, rng: np.random.Generator) -> None:
        super().__init__(env)
        self.rng = rng

    def step(self, action):
        time.sleep(self.rng.uniform(0, 1e-3))
        return self.env.step(action)


def make_env(kind: str, seed: int):
    """A factory of one env of ``kind`` (see the module)."""

    def make() -> gym.Env:
        env = gym.make("CartPole-v1")
        if kind == "work50":
            env = Busy(env, 50e-6)
        elif kind == "vary":
            env = Sleepy(env, np.random.default_rng(seed))
        return env

    return make


def one(system: str, n: int, kind: str, seconds: float, warmup: float, k: int) -> dict:
    """Run one system in this process; its figure."""
    import torch  # noqa: F401  (a learner's process has it)

    fns = [make_env(kind, i) for i in range(n)]
    if system == "sync":
        envs = gym.vector.SyncVectorEnv(fns)
    elif system == "gym":
        envs = gym.vector.AsyncVectorEnv(fns, shared_memory=True)
    else:
        from minidist.gymnasium import AsyncVectorEnv

        kwargs = {"num_workers": min(2, n)} if system == "md2" else {}
        if system == "md-k":
            kwargs["batch_size"] = k
        envs = AsyncVectorEnv(fns, **kwargs)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, (1024, n))
    try:
        if system == "md-k":
            envs.async_reset(seed=0)

            def step(t: int) -> int:
                *_, info = envs.recv()
                ids = info["env_id"]
                envs.send(actions[t % 1024, :k], ids)
                return k
        else:
            envs.reset(seed=0)

            def step(t: int) -> int:
                envs.step(actions[t % 1024])
                return n

        t, end = 0, time.perf_counter() + warmup
        while time.perf_counter() < end:
            step(t)
            t += 1
        steps, start = 0, time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            steps += step(t)
            t += 1
        elapsed = time.perf_counter() - start
    finally:
        envs.close()
    return {"system": system, "envs": n, "env": kind, "k": k,
            "steps_per_s": steps / elapsed}


def run_one(system: str, n: int, kind: str, args) -> float | None:
    cmd = [sys.executable, __file__, "--one", system, "--envs", str(n), "--env", kind,
           "--seconds", str(args.seconds), "--warmup", str(args.warmup), "-k", str(args.k)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                               ""))
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                             timeout=args.seconds + args.warmup + 300)
    except subprocess.TimeoutExpired:
        print(f"  {system} W={n} {kind}: timed out", flush=True)
        return None
    for line in out.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])["steps_per_s"]
    print(f"  {system} W={n} {kind}: failed\n{out.stdout[-2000:]}{out.stderr[-2000:]}",
          flush=True)
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", default="1,8,32,128", help="numbers of envs (W)")
    p.add_argument("--env", default="cartpole", help="cartpole,work50,vary")
    p.add_argument("--systems", default="sync,gym,md,md2", help=",".join(SYSTEMS))
    p.add_argument("-k", type=int, default=8, help="md-k: envs per recv()")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--json", help="write every run's figure here")
    p.add_argument("--plot", help="a PNG of steps/s against W (needs matplotlib)")
    p.add_argument("--replot", help="only draw --plot from this --json file of results")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.replot:
        plot(json.loads(Path(args.replot).read_text())["results"], args.plot or "vecenv.png")
        return
    if args.one:
        print(MARK + json.dumps(one(args.one, int(args.envs), args.env, args.seconds,
                                    args.warmup, args.k)), flush=True)
        return
    systems = args.systems.split(",")
    for s in systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r}")
    configs = [(int(n), kind) for kind in args.env.split(",") for n in args.envs.split(",")]
    runs: dict[tuple, list] = {}
    print(f"# vecenv: {os.cpu_count()} cpus, {args.rounds} rounds of {args.seconds:g} s",
          flush=True)
    for _ in range(args.rounds):
        for n, kind in configs:
            for s in systems:
                if s == "md-k" and args.k >= n:
                    continue
                runs.setdefault((s, n, kind), []).append(run_one(s, n, kind, args))
    results = []
    for n, kind in configs:
        print(f"W={n} env={kind}")
        for s in systems:
            got = runs.get((s, n, kind))
            if not got:
                continue
            ok = [x for x in got if x is not None]
            if not ok:
                continue
            row = {"system": s, "envs": n, "env": kind, "k": args.k, "rounds": got,
                   "median": statistics.median(ok)}
            line = f"  {s:6s} {row['median'] / 1e3:8.1f}k steps/s"
            for peer in ("gym", "md") if s == "md-k" else ("gym",):
                theirs = runs.get((peer, n, kind))
                if theirs and peer != s:
                    ratios = [a / b for a, b in zip(got, theirs, strict=True) if a and b]
                    if ratios:
                        row[f"x_{peer}"] = statistics.median(ratios)
                        line += f"   {row[f'x_{peer}']:.2f}x {peer}"
            print(line, flush=True)
            results.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results},
                                              indent=1))
    if args.plot:
        plot(results, args.plot)


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {"sync": "gymnasium SyncVectorEnv", "gym": "gymnasium AsyncVectorEnv",
             "md": "minidist AsyncVectorEnv", "md2": "minidist, num_workers=2",
             "md-k": "minidist, first k (recv)"}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for kind in sorted({r["env"] for r in results}):
        for s in names:
            pts = sorted((r["envs"], r["median"]) for r in results
                         if r["system"] == s and r["env"] == kind)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        label=names[s] + ("" if kind == "cartpole" else f" ({kind})"))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("environments (W)")
    ax.set_ylabel("env steps per second")
    ax.set_title("CartPole-v1 on 2 cores: steps/s against the number of envs")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
