"""A learner shares its policy's weights with every env worker: once per node, in place.

Rank 0 is the learner, every other rank an env worker. The policy is a linear map from
observations to action scores (a numpy array). Each iteration, every worker takes the
latest weights with ``read()`` (a view, no copy: cheap enough to call every step),
plays a short episode of a toy environment and sends its return and the version it
played with to the learner; the learner takes one step on those returns and publishes
the new weights as the next version. Workers never wait for weights: they play with
whatever version is the latest, and the learner sees how stale each episode was.

    python -m minidist run -n 5 examples/rl_weights.py [ITERATIONS]

With torch, ``minidist.torch.share_module(model)`` does the same for an nn.Module
(docs/weights.md).
"""

from __future__ import annotations

import sys

import numpy as np

import minidist

OBS, ACTIONS, STEPS = 16, 4, 32


def episode(weights: np.ndarray, rng: np.random.Generator) -> float:
    """A toy environment: the reward is 1 when the policy picks the action the
    observation's first ACTIONS entries point at."""
    total = 0.0
    for _ in range(STEPS):
        obs = rng.standard_normal(OBS).astype(np.float32)
        action = int(np.argmax(obs @ weights))
        total += float(action == int(np.argmax(obs[:ACTIONS])))
    return total / STEPS


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    minidist.init()
    rank, world = minidist.get_rank(), minidist.get_world_size()
    if world < 2:
        raise SystemExit("run it with at least 2 processes: minidist run -n 5 ...")
    policy = minidist.SharedArray("policy", (OBS, ACTIONS), np.float32, src=0)
    rng = np.random.default_rng(rank)
    if rank == 0:
        weights = np.zeros((OBS, ACTIONS), np.float32)
        policy.publish(weights)
        best = weights.copy()
        best_score = -1.0
        for it in range(iterations):
            results = [minidist.recv_object(src=None) for _ in range(world - 1)]
            score = float(np.mean([r for r, _v in results]))
            stale = [policy.latest - v for _r, v in results]
            if score > best_score:
                best, best_score = weights.copy(), score
            # a random-search step from the best weights so far
            weights = best + 0.3 * rng.standard_normal(best.shape).astype(np.float32)
            v = policy.publish(weights)
            print(f"iteration {it}: mean return {score:.2f}, published version {v}, "
                  f"episodes {max(stale)} versions stale at most", flush=True)
        for r in range(1, world):
            minidist.send_object(None, dst=r)
        print(f"learner done: best mean return {best_score:.2f}", flush=True)
    else:
        policy.wait(1)  # the first weights
        for _ in range(iterations):
            weights, version = policy.read()  # the latest weights, in place
            minidist.send_object((episode(weights, rng), version), dst=0)
        policy.release()
        minidist.recv_object(src=0)
    minidist.barrier()
    policy.close()
    minidist.destroy()


if __name__ == "__main__":
    main()
