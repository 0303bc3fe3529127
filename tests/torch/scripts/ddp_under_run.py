"""An unchanged torch DDP script, started by `minidist run`: init_process_group with
torch's default env:// rendezvous and the "minidist" backend."""

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import minidist.torch  # noqa: F401  (registers the backend)

dist.init_process_group("minidist")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
model(torch.ones(3, 4) * (rank + 1)).sum().backward()
grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
mine = grads.clone()
dist.broadcast(grads, src=0)
assert torch.equal(grads, mine), "ranks disagree on the averaged gradients"
print(f"DDP OK rank={rank}", flush=True)
Path(sys.argv[1], f"ready{rank}").touch()
while not Path(sys.argv[1], "go").exists():  # the test counts ports meanwhile
    time.sleep(0.05)
dist.destroy_process_group()
