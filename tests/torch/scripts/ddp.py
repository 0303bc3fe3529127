"""A small MLP trained 20 steps with DistributedDataParallel; saves the final parameters.

``ddp.py MODE OUT``, in the environment torchrun gives its workers. MODE:
``gloo`` (torch's own), ``minidist`` (torch.distributed.init_process_group("minidist"),
bootstrapped from torch's store) or ``dropin`` (``import minidist.torch as dist`` and
``dist.init_process_group("gloo")``, DDP on torch's default group that it sets up).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    if mode == "gloo":
        tdist.init_process_group("gloo")
    elif mode == "minidist":
        import minidist.torch  # noqa: F401  (registers the backend)

        tdist.init_process_group("minidist")
        assert tdist.get_backend() == "minidist"
    else:
        import minidist.torch as dist

        dist.init_process_group("gloo")
    rank, world = tdist.get_rank(), tdist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4))
    # different starting points per rank: DDP's first broadcast must even them out
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * rank)
    ddp = DDP(model, bucket_cap_mb=0.0005)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1234 + rank)
    for _ in range(20):
        x = torch.randn(32, 8, generator=data)
        y = torch.randn(32, 4, generator=data)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(os.path.join(out, f"{mode}_rank{rank}.npy"), params)
    print(f"rank {rank}/{world} {mode} loss={loss.item():.5f}", flush=True)
    tdist.barrier()
    tdist.destroy_process_group()
    if mode == "gloo":
        # the reference only: torch's gloo sometimes aborts in a C++ destructor at
        # interpreter exit ("terminate called without an active exception") after its
        # work is done; minidist's modes exit normally, so their exit stays checked
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
