"""torch code written for NCCL's elastic path, on CPU: a DDP-style loop (gradients
all-reduced over the default group) in which rank 1 dies at step 10; the
survivors call torch.distributed.shrink_group with the dead group rank, redo the step
on the shrunk default group and go on. Every survivor checks that the others hold the
same parameters, and that torch's default group is the shrunk one."""

import os
import signal
import sys

import torch
import torch.distributed as dist

import minidist.torch  # noqa: F401  (registers the backend)

dist.init_process_group("minidist")
rank, n = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
dist.broadcast(torch.nn.utils.parameters_to_vector(model.parameters()), src=0)
steps, step, shrinks = 30, 0, 0
while step < steps:
    if step == 10 and rank == 1 and shrinks == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    opt.zero_grad()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
    model(x).pow(2).mean().backward()
    try:
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
    except Exception as e:  # a member died: go on without it
        dead = sorted(getattr(e, "ranks", None) or [1])
        members = dist.get_process_group_ranks(dist.group.WORLD)
        excluded = [members.index(r) for r in dead if r in members]
        dist.shrink_group(excluded)
        shrinks += 1
        continue  # redo the step on the shrunk group
    opt.step()
    step += 1
vec = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
first = vec.clone()
dist.broadcast(first, src=0)
same = torch.equal(first, vec) and bool(torch.isfinite(vec).all())
size = dist.get_world_size()
print(f"ELASTIC DDP rank={rank} newrank={dist.get_rank()} size={size} shrinks={shrinks} "
      f"same={same} backend={dist.get_backend()}", flush=True)
dist.destroy_process_group()
sys.exit(0 if same else 1)
