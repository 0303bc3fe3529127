"""The many-process RL layout: one agent per node, every other process an env worker.

Run with ``minidist run -n 128 examples/rl_groups.py [rounds]`` (or under torchrun).
Every rank creates three groups, in the same order, as torch.distributed code does:
``agents`` (local rank 0 of every node), ``env_workers`` (every other rank) and
``env_workers_of_this_node`` (local ranks 1.. of this node; each node names its own).
Then a few rounds: the agents all_reduce among themselves, the env workers all_reduce
among themselves and per node, and each node's workers meet at a barrier. Rank 0
prints N, the number of groups, the setup time and the listening TCP ports the job
used, read from /proc.
"""

import os
import sys
import time

import numpy as np

import minidist
from minidist import ReduceOp, diagnostics


def main() -> None:
    t_start = time.time()
    minidist.init()
    rank, world = minidist.get_rank(), minidist.get_world_size()
    per_node = minidist.get_local_world_size()
    local = minidist.get_local_rank()
    node = rank // per_node
    nodes = world // per_node

    agent_ranks = [n * per_node for n in range(nodes)]
    worker_ranks = [r for r in range(world) if r % per_node != 0]
    agents = minidist.new_group(agent_ranks)
    env_workers = minidist.new_group(worker_ranks)
    node_workers = minidist.new_group([node * per_node + i for i in range(1, per_node)])
    minidist.barrier()
    t_setup = time.time()

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for step in range(rounds):
        if local == 0:
            grads = np.full(4096, rank + step, np.float32)
            minidist.all_reduce(grads, group=agents)
            assert grads[0] == sum(r + step for r in agent_ranks), grads[0]
        elif per_node > 1:
            stats = np.array([rank, 1.0, step], np.float64)
            minidist.all_reduce(stats, group=env_workers)
            assert stats[1] == len(worker_ranks) and stats[0] == sum(worker_ranks)
            mine = np.array([rank], np.int64)
            minidist.all_reduce(mine, op=ReduceOp.MAX, group=node_workers)
            assert mine[0] == node * per_node + per_node - 1
            minidist.barrier(group=node_workers)

    # setup time: from the moment the last process began init to the moment the last
    # one left the first barrier (that is, after the processes are up)
    times = np.array([t_start, t_setup], np.float64)
    minidist.all_reduce(times, op=ReduceOp.MAX)
    pids = np.zeros(world, np.int64)
    pids[rank] = os.getpid()
    minidist.all_reduce(pids)
    if rank == 0:
        job = [int(p) for p in pids] + [os.getppid()]  # the ranks and their launcher
        ports, conns = diagnostics.tcp_sockets(job)
        between_ranks = [c for c in conns if c[0] in set(pids.tolist())]
        print(f"N={world} groups=3 setup={times[1] - times[0]:.3f}s "
              f"listening_tcp_ports={len(ports)} tcp_connections_between_ranks="
              f"{len(between_ranks)} rounds={rounds}", flush=True)
    gate = os.environ.get("MINIDIST_TEST_GATE")
    if gate:  # let a test look at the running job from outside
        print("READY", flush=True)
        end = time.time() + 120
        while not os.path.exists(gate) and time.time() < end:
            time.sleep(0.05)
    minidist.barrier()
    minidist.destroy()


if __name__ == "__main__":
    main()
