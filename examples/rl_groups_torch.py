"""The RL layout of ``rl_groups.py``, written for plain torch.distributed with gloo.

Run with ``torchrun --standalone --nproc-per-node 64 examples/rl_groups_torch.py [rounds]``
(or ``python -m torch.distributed.run ...``). It is the baseline that
``benchmarks/footprint.py`` runs beside ``minidist run -n N examples/rl_groups.py``.

Every rank calls ``init_process_group("gloo")`` from torchrun's environment, then
``new_group`` for ``agents`` (local rank 0 of every node), ``env_workers`` (every other
rank) and the env workers of each node. gloo needs every rank of the default group to
take part in every ``new_group`` call, in the same order, so each rank creates the
worker group of EVERY node and keeps its own. Then a first barrier, a few rounds of
all_reduce in those groups (as in rl_groups.py), and rank 0 prints the same summary line:
N, the number of groups, the setup time (from the moment the last process began init to
the moment the last one left the first barrier, an all_reduce MAX of wall-clock times),
and the listening TCP ports and TCP connections of the job's processes read from /proc.
With ``MINIDIST_TEST_GATE=path`` every rank prints READY and waits (up to 120 s) for
that file, so an outside observer can measure the job while it holds its connections.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

from minidist import diagnostics


def say(line: str) -> None:
    """One write per line: the ranks share torchrun's stdout, often unbuffered."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    t_start = time.time()
    dist.init_process_group("gloo")  # env:// from torchrun: MASTER_ADDR/PORT, RANK, ...
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    local = int(os.environ.get("LOCAL_RANK", rank % per_node))
    node = rank // per_node
    nodes = world // per_node

    agent_ranks = [n * per_node for n in range(nodes)]
    worker_ranks = [r for r in range(world) if r % per_node != 0]
    agents = dist.new_group(agent_ranks)
    env_workers = dist.new_group(worker_ranks) if worker_ranks else None
    node_workers = None
    if per_node > 1:
        for n in range(nodes):  # every rank takes part in every node's group, in order
            g = dist.new_group([n * per_node + i for i in range(1, per_node)])
            if n == node:
                node_workers = g
    dist.barrier()
    t_setup = time.time()

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for step in range(rounds):
        if local == 0:
            grads = torch.full((4096,), float(rank + step), dtype=torch.float32)
            dist.all_reduce(grads, group=agents)
            assert grads[0].item() == sum(r + step for r in agent_ranks), grads[0]
        elif per_node > 1:
            stats = torch.tensor([rank, 1.0, step], dtype=torch.float64)
            dist.all_reduce(stats, group=env_workers)
            assert stats[1].item() == len(worker_ranks), stats
            assert stats[0].item() == sum(worker_ranks), stats
            mine = torch.tensor([rank], dtype=torch.int64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=node_workers)
            assert mine[0].item() == node * per_node + per_node - 1, mine
            dist.barrier(group=node_workers)

    # setup time: from the moment the last process began init to the moment the last
    # one left the first barrier (that is, after the processes are up)
    times = torch.tensor([t_start, t_setup], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    pids = torch.zeros(world, dtype=torch.int64)
    pids[rank] = os.getpid()
    dist.all_reduce(pids)
    if rank == 0:
        rank_pids = [int(p) for p in pids.tolist()]
        job = rank_pids + [os.getppid()]  # the ranks and their launcher (torchrun's agent)
        ports, conns = diagnostics.tcp_sockets(job)
        between_ranks = [c for c in conns if c[0] in set(rank_pids)]
        groups = 2 + (nodes if per_node > 1 else 0)  # new_group calls this rank made
        say(f"N={world} groups=3 setup={times[1].item() - times[0].item():.3f}s "
            f"listening_tcp_ports={len(ports)} tcp_connections_between_ranks="
            f"{len(between_ranks)} rounds={rounds} new_group_calls={groups}")
    gate = os.environ.get("MINIDIST_TEST_GATE")
    if gate:  # let a test look at the running job from outside
        say("READY")
        end = time.time() + 120
        while not os.path.exists(gate) and time.time() < end:
            time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
