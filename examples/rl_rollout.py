"""RL rollouts with torch.distributed calls, served by minidist: one agent per node,
every other process an environment worker.

Run with ``minidist run -n 16 examples/rl_rollout.py [--rounds R] [--nodes K]`` or
``torchrun --standalone --nproc-per-node 16 examples/rl_rollout.py``. It is written for
torch.distributed; the only minidist-specific line is the import.

* The ranks form ``K`` nodes of consecutive ranks (default: the launcher's nodes, from
  LOCAL_WORLD_SIZE; ``--nodes`` splits one machine into several to try more agents).
  Local rank 0 of each node is its agent; the others are its env workers.
* Every round each env worker steps a small numpy environment and sends its
  observation and reward to its agent with ``isend``; the agent batches the
  observations, runs its linear policy on them and answers each worker with an action.
* Every ``--sync-every`` rounds the agents all_reduce their policy gradients (a
  REINFORCE-like estimate from the rewards they saw) in the ``agents`` group and apply
  the mean, so that every agent keeps the same policy; the env workers all_reduce their
  episode counts in the ``env_workers`` group and meet at their node's barrier.

At the end the agents check that their policies are bit-identical, and rank 0 prints
one summary line starting with ``ROLLOUT``.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

import minidist.torch as dist  # was: import torch.distributed as dist

OBS = 4  # observation size
ACTIONS = 3  # discrete actions: push left, nothing, push right


class Cart:
    """A tiny 1-D control task: keep a drifting cart near 0 by pushing it."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.reset()
        self.episodes = 0

    def reset(self) -> None:
        self.x, self.v, self.t = self.rng.uniform(-0.5, 0.5), 0.0, 0

    def obs(self) -> np.ndarray:
        return np.array([self.x, self.v, self.t / 100.0, 1.0], np.float32)

    def step(self, action: int) -> float:
        self.v += 0.05 * (action - 1) + self.rng.normal(0, 0.01)
        self.x += self.v
        self.t += 1
        reward = 1.0 - min(abs(self.x), 1.0)
        if abs(self.x) > 2.0 or self.t >= 100:
            self.episodes += 1
            self.reset()
        return reward


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--nodes", type=int, default=0)
    p.add_argument("--sync-every", type=int, default=5)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    nodes = args.nodes or max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    if world % nodes or world // nodes < 2:
        raise SystemExit(f"{world} ranks do not split into {nodes} nodes of 2 or more")
    per_node = world // nodes
    node, local = divmod(rank, per_node)
    my_agent = node * per_node
    agent_ranks = [n * per_node for n in range(nodes)]
    worker_ranks = [r for r in range(world) if r % per_node]

    # the three groups of the RL layout, created by every rank in the same order
    agents = dist.new_group(agent_ranks)
    env_workers = dist.new_group(worker_ranks)
    node_workers = None
    for n in range(nodes):
        g = dist.new_group([n * per_node + i for i in range(1, per_node)])
        if n == node:
            node_workers = g

    if local == 0:
        run_agent(args, rank, my_agent, per_node, agents, len(agent_ranks))
    else:
        run_worker(args, rank, my_agent, env_workers, node_workers, len(worker_ranks))
    dist.barrier()
    dist.destroy_process_group()


def run_agent(args, rank: int, me: int, per_node: int, agents, n_agents: int) -> None:
    torch.manual_seed(0)  # the same initial policy on every agent
    policy = torch.nn.Linear(OBS, ACTIONS)
    workers = [me + i for i in range(1, per_node)]
    obs = torch.empty(len(workers), OBS)
    rewards = torch.empty(len(workers), 1)
    grads = [torch.zeros_like(p) for p in policy.parameters()]
    total_reward, steps, syncs = 0.0, 0, 0
    for step in range(args.rounds):
        reqs = []
        for i, w in enumerate(workers):  # one observation and reward from each worker
            reqs.append(dist.irecv(obs[i], src=w, tag=1))
            reqs.append(dist.irecv(rewards[i], src=w, tag=2))
        for r in reqs:
            r.wait()
        logits = policy(obs)
        actions = logits.argmax(dim=1)
        sends = [dist.isend(actions[i:i + 1].clone(), dst=w, tag=3)
                 for i, w in enumerate(workers)]
        # a REINFORCE-like gradient from what this agent saw
        logp = torch.log_softmax(logits, dim=1).gather(1, actions[:, None])
        loss = -(logp * (rewards - rewards.mean())).sum()
        policy.zero_grad()
        loss.backward()
        for g, p in zip(grads, policy.parameters()):
            g += p.grad
        total_reward += float(rewards.sum())
        steps += len(workers)
        for s in sends:
            s.wait()
        if (step + 1) % args.sync_every == 0:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=agents)
            flat /= n_agents
            with torch.no_grad():
                offset = 0
                for p in policy.parameters():
                    p -= 0.01 * flat[offset:offset + p.numel()].view_as(p)
                    offset += p.numel()
            for g in grads:
                g.zero_()
            syncs += 1
    # every agent must hold the same policy
    mine = torch.cat([p.detach().reshape(-1) for p in policy.parameters()])
    everyone = [torch.empty_like(mine) for _ in range(n_agents)]
    dist.all_gather(everyone, mine, group=agents)
    assert all(torch.equal(mine, e) for e in everyone), "agents' policies diverged"
    stats = torch.tensor([total_reward, float(steps), float(syncs)], dtype=torch.float64)
    dist.all_reduce(stats, group=agents)
    if rank == 0:
        print(f"ROLLOUT N={dist.get_world_size()} agents={n_agents} "
              f"steps={int(stats[1])} syncs={int(stats[2])} "
              f"mean_reward={stats[0] / max(stats[1], 1):.3f} policies_identical=True",
              flush=True)


def run_worker(args, rank: int, agent: int, env_workers, node_workers, n_workers: int
               ) -> None:
    env = Cart(seed=rank)
    action = torch.empty(1, dtype=torch.int64)
    last = 0.0  # the reward of the previous step
    for step in range(args.rounds):
        obs = torch.from_numpy(env.obs())  # zero-copy: shares the numpy array's memory
        sent = [dist.isend(obs, dst=agent, tag=1)]
        reward = torch.tensor([last], dtype=torch.float32)
        sent.append(dist.isend(reward, dst=agent, tag=2))
        dist.recv(action, src=agent, tag=3)
        for s in sent:
            s.wait()
        last = env.step(int(action))
        if (step + 1) % args.sync_every == 0:
            episodes = torch.tensor([env.episodes, 1], dtype=torch.int64)
            dist.all_reduce(episodes, group=env_workers)
            assert int(episodes[1]) == n_workers, episodes
            dist.barrier(group=node_workers)


if __name__ == "__main__":
    main()
