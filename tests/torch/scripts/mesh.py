"""DeviceMesh, DTensor, FSDP2 (``fully_shard``) and torch.distributed.checkpoint on CPU.

``mesh.py MODE OUT``, in the environment torchrun gives its workers, on 4 ranks. MODE:
``gloo`` (torch's own) or ``minidist`` (``init_process_group("minidist")``). Prints
``rank R: OK <step>`` after each step and saves, in OUT, the parameters that FSDP2
trained (``MODE_rankR.npy``) for comparison between the modes.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def ok(step: str, rank: int | None = None) -> None:
    rank = tdist.get_rank() if rank is None else rank
    print(f"rank {rank}: OK {step}", flush=True)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    if mode == "minidist":
        import minidist.torch  # noqa: F401  (registers the backend)
    tdist.init_process_group(mode)
    rank, world = tdist.get_rank(), tdist.get_world_size()
    assert world == 4, world

    # a 2 x 2 mesh: its dimensions' groups are groups of the default backend
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        g = mesh.get_group(dim)
        assert tdist.get_backend(g) == mode, (dim, tdist.get_backend(g))
        t = torch.tensor([float(rank)])
        tdist.all_reduce(t, group=g)
        ranks = tdist.get_process_group_ranks(g)
        assert t.item() == sum(ranks), (dim, ranks, t)
    ok("device_mesh")

    # DTensor: shard, gather back, redistribute, compute
    full = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    dt = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    assert dt.to_local().shape == (4, 4), dt.to_local().shape
    assert torch.equal(dt.full_tensor(), full)
    re = dt.redistribute(mesh, [Replicate(), Shard(0)])
    assert torch.equal(re.full_tensor(), full)
    assert torch.equal((dt + dt).sum().full_tensor(), 2 * full.sum())
    assert torch.equal((dt @ dt.T).full_tensor(), full @ full.T)
    ok("dtensor")

    # FSDP2 on a 1-D mesh of the world: 10 steps of SGD
    world_mesh = init_device_mesh("cpu", (world,))
    net = model()
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=world_mesh)
    fully_shard(net, mesh=world_mesh)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1234 + rank)
    for _ in range(10):
        x = torch.randn(16, 8, generator=data)
        y = torch.randn(16, 4, generator=data)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    params = [p.full_tensor().detach() for p in net.parameters()]
    flat = torch.cat([p.reshape(-1) for p in params]).numpy()
    np.save(os.path.join(out, f"{mode}_rank{rank}.npy"), flat)
    ok("fsdp2")

    # torch.distributed.checkpoint: save the sharded state, load it into a fresh model
    path = os.path.join(out, f"{mode}_checkpoint")
    dcp.save({"model": net.state_dict()}, checkpoint_id=path)
    fresh = model()
    for layer in fresh:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=world_mesh)
    fully_shard(fresh, mesh=world_mesh)
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=path)
    fresh.load_state_dict(state["model"])
    for a, b in zip(net.parameters(), fresh.parameters()):
        assert torch.equal(a.full_tensor(), b.full_tensor())
    ok("checkpoint")

    tdist.barrier()
    tdist.destroy_process_group()
    ok("destroyed", rank)


if __name__ == "__main__":
    main()
