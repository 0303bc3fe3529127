"""One learner stepping many environments, three ways: lockstep through collectives,
lockstep through messages, and first-k through ``recv_many``.

Run with ``minidist run -n 9 examples/rl_stepping.py [--way collectives|messages|first_k]
[--steps S] [-k K]``. Rank 0 is the learner; every other rank runs one small
environment. Each step the learner picks one action per worker from a linear policy of
the observations it has, sends the actions, and takes the workers' next observations:

* ``collectives``: ``scatter`` of the actions, ``gather`` of the observations (every
  worker steps once per learner step, the learner waits for the slowest);
* ``messages``: the same with ``send`` and ``recv`` to and from each worker;
* ``first_k``: the learner takes whichever ``K`` workers have an observation ready
  (``recv_many``), answers those, and lets the others keep stepping (EnvPool's
  ``batch_size < num_envs``): a slow environment no longer holds up the others.

The environments' step times vary (0 - 1 ms), so ``first_k`` steps the most
environments per second. Rank 0 prints one line starting with ``STEPPING``: the way,
env steps per second, and the mean reward.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import minidist

OBS = 4  # observation: position, velocity, and the last action and reward
STOP = -1


class Cart:
    """A tiny 1-D control task: keep a drifting cart near 0 by pushing it (action 0, 1
    or 2: left, nothing, right). A step sleeps 0 - 1 ms, as a simulator would."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.x = self.v = 0.0
        self.obs = np.zeros(OBS, np.float32)

    def step(self, action: int) -> np.ndarray:
        self.v += 0.1 * (action - 1) + self.rng.normal(0, 0.05)
        self.x += 0.1 * self.v
        time.sleep(self.rng.uniform(0, 1e-3))
        self.obs[:] = (self.x, self.v, action, -abs(self.x))
        return self.obs


def policy(obs: np.ndarray) -> np.ndarray:
    """One action per row of observations: push against the drift."""
    return np.where(obs[:, 0] + obs[:, 1] > 0, 0, 2).astype(np.int64)


def learner(way: str, steps: int, k: int, n: int) -> None:
    workers = n - 1
    obs = np.zeros((n, OBS), np.float32)  # row r: worker r's latest (row 0: unused)
    actions = np.zeros(n, np.int64)
    taken = 0
    start = time.perf_counter()
    if way == "first_k":
        act = np.zeros(1, np.int64)
        for w in range(1, n):  # every worker starts stepping
            act[0] = 1
            minidist.send(act, w)
        rows = np.zeros((k, OBS), np.float32)
        for _ in range(steps):
            senders = minidist.recv_many(rows)  # the first k that are ready
            obs[senders] = rows
            for w, a in zip(senders.tolist(), policy(rows).tolist(), strict=True):
                act[0] = a
                minidist.send(act, w)  # only those k step again
            taken += k
        rest = np.zeros((workers, OBS), np.float32)
        minidist.recv_many(rest)  # every worker has one observation on its way
        for w in range(1, n):
            act[0] = STOP
            minidist.send(act, w)
    else:
        mine = np.zeros(OBS, np.float32)
        act = np.zeros(1, np.int64)
        for _ in range(steps):
            actions[1:] = policy(obs[1:])
            if way == "collectives":
                minidist.scatter(act, actions, src=0)
                minidist.gather(mine, obs, dst=0)
            else:
                for w in range(1, n):
                    minidist.send(actions[w:w + 1], w)
                for w in range(1, n):
                    minidist.recv(obs[w], w)
            taken += workers
        actions[:] = STOP
        if way == "collectives":
            minidist.scatter(act, actions, src=0)
        else:
            for w in range(1, n):
                minidist.send(actions[w:w + 1], w)
    seconds = time.perf_counter() - start
    print(f"STEPPING way={way} workers={workers} env_steps_per_s={taken / seconds:.0f} "
          f"mean_reward={obs[1:, 3].mean():.3f}", flush=True)


def worker(way: str, rank: int) -> None:
    env = Cart(rank)
    act = np.zeros(1, np.int64)
    while True:
        if way == "collectives":
            minidist.scatter(act, None, src=0)
        else:
            minidist.recv(act, 0)
        if act[0] == STOP:
            return
        obs = env.step(int(act[0]))
        if way == "collectives":
            minidist.gather(obs, None, dst=0)
        else:
            minidist.send(obs, 0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--way", choices=("collectives", "messages", "first_k"),
                   default="first_k")
    p.add_argument("--steps", type=int, default=2000, help="learner steps")
    p.add_argument("-k", type=int, default=4, help="first_k: workers per learner step")
    a = p.parse_args()
    minidist.init()
    rank, n = minidist.get_rank(), minidist.get_world_size()
    if n < 2 or (a.way == "first_k" and not 1 <= a.k <= n - 1):
        raise SystemExit("run with at least 2 ranks, and 1 <= k <= workers")
    if rank == 0:
        learner(a.way, a.steps, a.k, n)
    else:
        worker(a.way, rank)
    minidist.destroy()


if __name__ == "__main__":
    main()
