"""A learner actor and env-worker actors on Ray, exchanging arrays through minidist.

    pip install "minidist[ray]"
    python examples/ray_learner_workers.py [--workers 3] [--rounds 5] [--address auto]

The layout of a reinforcement-learning job: one Learner actor and N EnvWorker actors,
in two Ray collective groups on the "minidist" backend:

* ``all``: the learner (rank 0) and every worker (ranks 1..N). The learner broadcasts
  its policy weights; each worker sends the learner its batch of observations
  (send / recv); everyone meets at a barrier at the end of a round;
* ``workers``: the env workers alone. They all_reduce their episode statistics. This
  group is created after ``all`` by actors that already share its minidist job, so it
  is a group of that job: no new socket, no new port.

The environment is a toy (observations drawn around a point per worker); the learner
moves its weights toward the mean observation, so the workers' mean distance to the
weights falls round after round. Only numpy is used; CPU torch tensors work the same.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import ray
import ray.util.collective as col

import minidist.ray  # registers the "minidist" backend (in the driver and the actors)

DIM = 8          # size of the policy's weights and of one observation
STEPS = 64       # observations per worker per round


@ray.remote(num_cpus=0)  # actors that mostly wait in collectives may share the CPUs
class Learner:
    def setup(self, world: int) -> str:
        col.init_collective_group(world, 0, backend="minidist", group_name="all")
        self.world = world
        self.weights = np.zeros(DIM, np.float32)
        return f"learner: rank {col.get_rank('all')} of {col.get_collective_group_size('all')}"

    def round(self) -> dict:
        col.broadcast(self.weights, src_rank=0, group_name="all")
        batches = np.empty((self.world - 1, STEPS, DIM), np.float32)
        for worker in range(1, self.world):
            col.recv(batches[worker - 1], worker, "all")
        self.weights += 0.5 * (batches.mean(axis=(0, 1)) - self.weights)
        col.barrier("all")
        return {"weights_norm": float(np.linalg.norm(self.weights))}

    def describe(self) -> list[dict]:
        return minidist.ray.describe()


@ray.remote(num_cpus=0)
class EnvWorker:
    def setup(self, world: int, rank: int) -> str:
        col.init_collective_group(world, rank, backend="minidist", group_name="all")
        # the env workers' own group: Ray rank rank - 1 of world - 1
        col.init_collective_group(world - 1, rank - 1, backend="minidist",
                                  group_name="workers")
        self.rank = rank
        self.rng = np.random.default_rng(rank)
        self.center = np.linspace(-1, 1, DIM, dtype=np.float32) * rank
        self.weights = np.empty(DIM, np.float32)
        return f"worker: rank {rank} of 'all', rank {col.get_rank('workers')} of 'workers'"

    def round(self) -> dict:
        col.broadcast(self.weights, src_rank=0, group_name="all")
        obs = self.center + self.rng.standard_normal((STEPS, DIM), np.float32)
        col.send(obs, 0, "all")
        distance = float(np.linalg.norm(obs.mean(axis=0) - self.weights))
        stats = np.array([distance, 1.0], np.float64)   # (sum of distances, workers)
        col.allreduce(stats, "workers")
        col.barrier("all")
        return {"mean_distance": stats[0] / stats[1]}

    def describe(self) -> list[dict]:
        return minidist.ray.describe()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--address", default=None,
                    help="a Ray cluster to join (default: start a local one)")
    args = ap.parse_args()

    ray.init(address=args.address, include_dashboard=False)
    try:
        world = args.workers + 1
        learner = Learner.remote()
        workers = [EnvWorker.remote() for _ in range(args.workers)]
        t = time.perf_counter()
        for line in ray.get([learner.setup.remote(world)] +
                            [w.setup.remote(world, i + 1) for i, w in enumerate(workers)]):
            print(line)
        print(f"groups ready in {time.perf_counter() - t:.2f} s")
        for r in range(args.rounds):
            t = time.perf_counter()
            out = ray.get([learner.round.remote()] + [w.round.remote() for w in workers])
            print(f"round {r}: weights norm {out[0]['weights_norm']:.3f}, workers' mean "
                  f"distance {out[1]['mean_distance']:.3f} ({time.perf_counter() - t:.3f} s)")
        jobs = ray.get(workers[0].describe.remote())
        print(f"worker 1 belongs to {len(jobs)} minidist job(s): {jobs}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
